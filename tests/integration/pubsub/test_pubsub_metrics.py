"""Pub/Sub stream metrics reach a real StatsD listener through Airflow's own Stats."""

from __future__ import annotations

import pytest

from airflow_shared_stream.testing import SharedStreamHarness
from tests.integration.pubsub.recording import RecordingTrigger, track
from tests.support.waiting import eventually

pytestmark = pytest.mark.integration


async def test_stream_metrics_are_sent_per_subscription(pubsub, statsd):
    dead_topic, _ = pubsub.topic_with_subscription()
    topic, subscription = pubsub.topic_with_subscription(ack_deadline_seconds=10)
    ledger = track(subscription, ack_deadline=10)
    prefix = f"airflow.shared_stream.pubsub.{subscription.rsplit('/', 1)[1]}"
    async with SharedStreamHarness(confirm_after=12.0) as harness:
        everything = harness.add(
            RecordingTrigger(subscription, dead_letter_topic=dead_topic, reject="body.bad")
        )
        harness.add(RecordingTrigger(subscription, dead_letter_topic=dead_topic, match="body.n == `1`"))
        sent = pubsub.publish(topic, [{"n": 1}, {"n": 2}, {"bad": True}])
        await everything.wait_for_events(2)
        await eventually(lambda: ledger.acked, lambda a: a == set(sent), timeout=60, what="settled")
        await eventually(
            lambda: statsd.counter(f"{prefix}.acked"), lambda n: n == 2, timeout=10, what="acked counter"
        )
    # Three messages, two watchers online, one rejected.
    statsd.assert_stream_counts(prefix, received=3, fanned_out=6, dead_lettered=1, redelivered=0)
    # Held 12 s on a 10 s ack deadline: the lease keeper extended them.
    assert statsd.counter(f"{prefix}.lease_extensions") >= 3
    for line in statsd.read():
        assert pubsub.project not in line  # metric names carry the subscription id only
