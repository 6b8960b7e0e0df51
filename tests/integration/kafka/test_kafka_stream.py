"""The Kafka shared stream against real brokers (noida-db and Tansu), through Airflow's manager."""

from __future__ import annotations

import asyncio
import json

import pytest

from airflow_shared_stream.kafka.trigger import KafkaSharedStreamTrigger
from airflow_shared_stream.testing import SharedStreamHarness

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


async def wait_committed(kafka, group, topic, expected, partitions=1, timeout=15.0):
    """Poll the group's committed offsets until they equal ``expected``; return the last seen."""
    deadline = asyncio.get_running_loop().time() + timeout
    seen = None
    while asyncio.get_running_loop().time() < deadline:
        seen = await kafka.committed(group, topic, partitions)
        if seen == expected:
            return seen
        await asyncio.sleep(0.2)
    return seen


async def test_fan_out_one_consumer_many_matches(kafka):
    topic = kafka.name("orders")
    await kafka.create_topics(topic)
    group = kafka.name("g")
    messages = [{"kind": "order" if i % 2 == 0 else "refund", "n": i} for i in range(20)]
    await kafka.produce(topic, messages, key=b"k", headers=[("source", b"web"), ("bin", b"\xff\x00")])

    common = {"topics": [topic], "kafka_conn_id": kafka.conn_id, "group_id": group}
    async with SharedStreamHarness(confirm_after=0.0) as h:
        orders = h.add(KafkaSharedStreamTrigger(**common, match="value.kind == 'order'"))
        refunds = h.add(KafkaSharedStreamTrigger(**common, match="value.kind == 'refund'"))
        everything = h.add(KafkaSharedStreamTrigger(**common))
        await everything.wait_for_events(20)
        await orders.wait_for_events(10)
        await refunds.wait_for_events(10)
        # One consumer for all three watchers.
        assert len(h.manager._groups) == 1
        assert [p["value"]["n"] for p in orders.payloads] == list(range(0, 20, 2))
        assert [p["value"]["n"] for p in refunds.payloads] == list(range(1, 20, 2))
        first = everything.payloads[0]
        assert first["topic"] == topic
        assert first["partition"] == 0
        assert first["offset"] == 0
        assert isinstance(first["timestamp"], int)
        assert first["key"] == "k"
        assert first["headers"] == {"source": "web", "bin": "base64:/wA="}
        json.dumps(everything.payloads)  # payloads must be JSON-able
        assert await wait_committed(kafka, group, topic, {0: 20}) == {0: 20}


async def test_commit_only_after_persistence_confirmed(kafka):
    topic = kafka.name("t")
    await kafka.create_topics(topic)
    group = kafka.name("g")
    await kafka.produce(topic, [f"m{i}" for i in range(5)])
    async with SharedStreamHarness(confirm_after=None) as h:
        w = h.add(KafkaSharedStreamTrigger([topic], kafka_conn_id=kafka.conn_id, group_id=group))
        await w.wait_for_events(5)
        await asyncio.sleep(1.0)
        assert await kafka.committed(group, topic) == {0: None}, "committed before persistence"
        h.confirm()
        assert await wait_committed(kafka, group, topic, {0: 5}) == {0: 5}
