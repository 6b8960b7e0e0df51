"""
Broker requests per message at steady state (issue 12), counted on the wire by a recording proxy.

Several watchers whose trigger events are persisted after varying delays make the manager
advance each receive lane of ten in pieces. Acking every piece on its own cost 2.4
``DeleteMessageBatch`` calls per ten messages; coalesced, the deletes come in full batches.
"""

from __future__ import annotations

import json
import math
import random

import pytest

from airflow_shared_stream.sqs.trigger import SqsSharedStreamTrigger
from airflow_shared_stream.testing import SharedStreamHarness
from tests.support.request_log import RecordingProxy
from tests.support.waiting import eventually

pytestmark = pytest.mark.integration

MESSAGES = 200
WATCHERS = 3


@pytest.fixture
def proxied_connection(sqs, monkeypatch):
    with RecordingProxy("127.0.0.1", sqs.port) as proxy:
        connection = sqs.connection()
        connection["extra"]["endpoint_url"] = proxy.endpoint_url
        monkeypatch.setenv("AIRFLOW_CONN_AWS_DEFAULT", json.dumps(connection))
        yield proxy


async def test_deletes_come_in_full_batches_when_lanes_are_advanced_in_pieces(sqs, proxied_connection):
    proxy = proxied_connection
    url = sqs.client.create_queue(QueueName=f"requests-{random.getrandbits(32):08x}")["QueueUrl"]
    for start in range(0, MESSAGES, 10):
        sqs.client.send_message_batch(
            QueueUrl=url,
            Entries=[{"Id": str(i), "MessageBody": json.dumps({"n": start + i})} for i in range(10)],
        )
    rng = random.Random(7)
    async with SharedStreamHarness(confirm_after=lambda: rng.uniform(0.05, 0.6)) as harness:
        watchers = [
            harness.add(SqsSharedStreamTrigger(url, max_in_flight=100, wait_time_seconds=1))
            for _ in range(WATCHERS)
        ]
        for watcher in watchers:
            await watcher.wait_for_events(MESSAGES, timeout=120)

        def on_the_queue() -> int:
            attributes = sqs.client.get_queue_attributes(
                QueueUrl=url,
                AttributeNames=["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"],
            )["Attributes"]
            return int(attributes["ApproximateNumberOfMessages"]) + int(
                attributes["ApproximateNumberOfMessagesNotVisible"]
            )

        await eventually(on_the_queue, lambda n: n == 0, timeout=60, what="every message deleted")
    counts = proxy.counts()
    full_batches = math.ceil(MESSAGES / 10)
    # A few partial batches at the stream's tail (the linger timer fires) are fine; one delete
    # per advanced piece (about 2.4 per receive) is what this catches.
    assert counts["DeleteMessageBatch"] <= full_batches * 1.3, counts
    assert counts["ReceiveMessage"] >= full_batches, counts
