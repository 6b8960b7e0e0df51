"""SQS stream metrics reach a real StatsD listener on loopback through Airflow's own Stats."""

from __future__ import annotations

import pytest

from airflow_shared_stream.sqs.trigger import SqsSharedStreamTrigger
from airflow_shared_stream.testing import SharedStreamHarness
from tests.support.waiting import eventually

pytestmark = pytest.mark.integration


async def test_stream_metrics_are_sent_per_queue(sqs, aws_connection, statsd, monkeypatch):
    from airflow_shared_stream.sqs.producer import SqsSharedStreamProducer

    monkeypatch.setattr(SqsSharedStreamProducer, "lag_interval_seconds", 0.5)
    dlq = sqs.create_queue()
    url = sqs.create_queue(visibility_timeout=2)
    queue_name = url.rsplit("/", 1)[1]
    prefix = f"airflow.shared_stream.sqs.{queue_name}"
    async with SharedStreamHarness(confirm_after=3.0) as harness:
        everything = harness.add(SqsSharedStreamTrigger(url, dead_letter_queue_url=dlq, reject="body.bad"))
        harness.add(SqsSharedStreamTrigger(url, dead_letter_queue_url=dlq, match="body.n == `1`"))
        sqs.send(url, [{"n": 1}, {"n": 2}, {"bad": True}])
        await everything.wait_for_events(2)
        await eventually(lambda: sqs.depth(url), lambda d: d == (0, 0), timeout=30, what="settled")
        await eventually(
            lambda: statsd.counter(f"{prefix}.acked"), lambda n: n == 2, timeout=10, what="acked counter"
        )
    # Three messages, two watchers online, one rejected.
    statsd.assert_stream_counts(prefix, received=3, fanned_out=6, dead_lettered=1, redelivered=0)
    # Held 3 s on a 2 s visibility timeout: the lease keeper extended them.
    assert statsd.counter(f"{prefix}.lease_extensions") >= 2
    assert statsd.has(f"{prefix}.broker_lag")
    for line in statsd.read():
        assert "testing" not in line  # no credential of the connection in a metric


async def test_a_full_credit_window_is_counted(sqs, aws_connection, statsd):
    url = sqs.create_queue()
    prefix = f"airflow.shared_stream.sqs.{url.rsplit('/', 1)[1]}"
    sqs.send(url, [{"n": i} for i in range(6)])
    async with SharedStreamHarness(confirm_after=0.5) as harness:
        watcher = harness.add(SqsSharedStreamTrigger(url, max_in_flight=2, wait_time_seconds=1))
        await watcher.wait_for_events(6)
    assert statsd.counter(f"{prefix}.credit_waits") >= 2
