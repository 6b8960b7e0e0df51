"""
Stream identity against moto's SQS server: every spelling of one queue is one stream.

Requests go to the connection's endpoint (moto); the queue URL names the queue. Two AWS
spellings of one queue URL are one receiver, and every watcher sees every message; a second
connection id for the same queue fails loudly, naming both, instead of starting a second,
competing receiver.
"""

from __future__ import annotations

import json
from urllib.parse import urlsplit

import pytest

from airflow_shared_stream.common.errors import StreamShapeConflictError
from airflow_shared_stream.sqs.trigger import SqsSharedStreamTrigger
from tests.integration.sqs.conftest import REGION
from tests.support.waiting import eventually

pytestmark = pytest.mark.integration

MESSAGES = 40


def aws_spellings(local_url: str) -> list[str]:
    """The queue moto created, spelled with two of AWS's hosts for its region."""
    path = urlsplit(local_url).path
    assert REGION == "us-east-1"
    return [f"https://sqs.us-east-1.amazonaws.com{path}", f"https://queue.amazonaws.com{path}/"]


async def test_two_aws_spellings_of_one_queue_share_one_receiver(sqs, aws_connection, harness):
    url = sqs.create_queue()
    watchers = [harness.add(SqsSharedStreamTrigger(spelling)) for spelling in aws_spellings(url)]
    sent = sqs.send(url, [{"n": i} for i in range(MESSAGES)])
    for watcher in watchers:
        await watcher.wait_for_events(MESSAGES, timeout=60)
    await eventually(lambda: sqs.depth(url), lambda d: d == (0, 0), timeout=30, what="queue drained")
    assert len(harness.manager._groups) == 1, list(harness.manager._groups)
    for watcher in watchers:
        assert sorted(p["message_id"] for p in watcher.payloads) == sorted(sent)


async def test_a_second_connection_id_for_one_queue_fails_naming_both(
    sqs, aws_connection, harness, monkeypatch
):
    monkeypatch.setenv("AIRFLOW_CONN_AWS_OTHER", json.dumps(sqs.connection()))
    url = sqs.create_queue()
    first = harness.add(SqsSharedStreamTrigger(url, aws_conn_id=aws_connection))
    sent = sqs.send(url, [{"n": i} for i in range(5)])
    await first.wait_for_events(len(sent))
    second = harness.add(
        SqsSharedStreamTrigger(url.replace("http://", "HTTP://") + "/", aws_conn_id="aws_other")
    )
    error = await second.wait_for_error(timeout=30)
    assert isinstance(error, StreamShapeConflictError), error
    assert "aws_conn_id='aws_other'" in str(error)
    assert f"{aws_connection!r}" in str(error)
    more = sqs.send(url, [{"n": i} for i in range(5, 10)])
    await first.wait_for_events(len(sent) + len(more))
    assert len(harness.manager._groups) == 1
