"""Ten watchers, a thousand messages, late persistence and small subscriber queues, against moto's server."""

from __future__ import annotations

import pytest

from airflow_shared_stream.sqs.trigger import SqsSharedStreamTrigger
from airflow_shared_stream.testing import SharedStreamHarness
from tests.support.waiting import eventually

pytestmark = pytest.mark.integration

EMPTY = (0, 0)


def ids_of(watcher) -> list[str]:
    return [p["message_id"] for p in watcher.payloads]


async def test_a_thousand_messages_through_ten_subscribers_with_late_confirmation(sqs, aws_connection):
    """Late persistence (1 s) and small subscriber queues: the credit window must prevent overflow."""
    url = sqs.create_queue()
    sent = sqs.send(url, [{"n": i} for i in range(1000)])
    async with SharedStreamHarness(confirm_after=1.0, max_subscriber_queue=128) as harness:
        watchers = [harness.add(SqsSharedStreamTrigger(url, max_in_flight=100)) for _ in range(10)]
        for watcher in watchers:
            await watcher.wait_for_events(1000, timeout=240)
        await eventually(lambda: sqs.depth(url), lambda d: d == EMPTY, timeout=60, what="drained")
    for watcher in watchers:
        assert watcher.error is None
        assert sorted(ids_of(watcher)) == sorted(sent)
