"""
Stream identity against Google's Pub/Sub emulator: two connection ids of one project.

The key is the subscription's full path, with the project a short name takes from its
connection; the connection id is not in it. Two connection ids that name one project therefore
reach one stream: the second watcher fails loudly, naming both connections (the stream reads
through the first one's credentials), and the first keeps every message. Two subscribers on
one subscription would have split the messages silently.
"""

from __future__ import annotations

import json

import pytest

from airflow_shared_stream.common.errors import StreamShapeConflictError
from airflow_shared_stream.pubsub.trigger import PubSubSharedStreamTrigger

pytestmark = pytest.mark.integration


async def test_two_connection_ids_of_one_project_are_one_stream_and_the_second_fails_naming_both(
    pubsub, harness, monkeypatch
):
    monkeypatch.setenv("AIRFLOW_CONN_GCP_OTHER", json.dumps(pubsub.connection()))
    topic, subscription = pubsub.topic_with_subscription()
    short = subscription.rsplit("/", 1)[1]
    first = harness.add(PubSubSharedStreamTrigger(short))  # google_cloud_default
    second = harness.add(PubSubSharedStreamTrigger(short, gcp_conn_id="gcp_other"))
    assert first.key == second.key == ("airflow_shared_stream.pubsub", subscription)
    error = await second.wait_for_error(timeout=30)
    assert isinstance(error, StreamShapeConflictError), error
    assert "gcp_conn_id='gcp_other'" in str(error)
    assert "'google_cloud_default'" in str(error)
    sent = pubsub.publish(topic, [{"n": i} for i in range(20)])
    await first.wait_for_events(len(sent))
    assert sorted(p["message_id"] for p in first.payloads) == sorted(sent)
    assert len(harness.manager._groups) == 1
