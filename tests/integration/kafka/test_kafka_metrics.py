"""Kafka stream metrics reach a real StatsD listener on loopback through Airflow's own Stats."""

from __future__ import annotations

import pytest

from airflow_shared_stream.kafka.trigger import KafkaSharedStreamTrigger
from airflow_shared_stream.testing import SharedStreamHarness
from tests.support.waiting import eventually

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


async def test_stream_metrics_are_sent_per_topic(kafka, statsd):
    topic, dlq = kafka.name("orders"), kafka.name("orders-dlq")
    await kafka.create_topics(topic, dlq)
    await kafka.produce(topic, [{"n": 1}, {"n": 2}, {"bad": True}])
    prefix = f"airflow.shared_stream.kafka.{topic}"
    common = {"topics": [topic], "kafka_config_id": kafka.conn_id, "dead_letter_topic": dlq}
    async with SharedStreamHarness(confirm_after=0.2) as harness:
        everything = harness.add(KafkaSharedStreamTrigger(**common, reject="value.bad"))
        harness.add(KafkaSharedStreamTrigger(**common, match="value.n == `1`"))
        await everything.wait_for_events(2)
        await eventually(
            lambda: statsd.counter(f"{prefix}.acked"), lambda n: n == 2, timeout=20, what="acked counter"
        )
        await eventually(
            lambda: statsd.has(f"{prefix}.broker_lag"), lambda seen: seen, timeout=20, what="lag gauge"
        )
    # Three records, two watchers online, one rejected.
    statsd.assert_stream_counts(prefix, received=3, fanned_out=6, dead_lettered=1, redelivered=0)
    for line in statsd.read():
        assert kafka.bootstrap not in line  # metric names carry the topic only
