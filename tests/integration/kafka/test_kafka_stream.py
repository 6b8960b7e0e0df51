"""The Kafka shared stream against real brokers (noida-db and Tansu), through Airflow's manager."""

from __future__ import annotations

import asyncio
import json

import pytest

from airflow_shared_stream.kafka.trigger import KafkaSharedStreamTrigger
from airflow_shared_stream.testing import SharedStreamHarness

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


async def test_fan_out_one_consumer_many_matches(kafka):
    topic = kafka.name("orders")
    await kafka.create_topics(topic)
    group = kafka.name("g")
    messages = [{"kind": "order" if i % 2 == 0 else "refund", "n": i} for i in range(20)]
    await kafka.produce(topic, messages, key=b"k", headers=[("source", b"web"), ("bin", b"\xff\x00")])

    common = {"topics": [topic], "kafka_config_id": kafka.conn_id, "group_id": group}
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
        assert await kafka.wait_committed(group, topic, {0: 20}) == {0: 20}


async def test_commit_only_after_persistence_confirmed(kafka):
    topic = kafka.name("t")
    await kafka.create_topics(topic)
    group = kafka.name("g")
    await kafka.produce(topic, [f"m{i}" for i in range(5)])
    async with SharedStreamHarness(confirm_after=None) as h:
        w = h.add(KafkaSharedStreamTrigger([topic], kafka_config_id=kafka.conn_id, group_id=group))
        await w.wait_for_events(5)
        await asyncio.sleep(1.0)
        assert await kafka.committed(group, topic) == {0: 0}, "committed past the start before persistence"
        h.confirm()
        assert await kafka.wait_committed(group, topic, {0: 5}) == {0: 5}


async def test_slow_partition_does_not_delay_commits_on_another(kafka):
    topic = kafka.name("lanes")
    await kafka.create_topics(topic, partitions=2)
    group = kafka.name("g")
    await kafka.produce(topic, [f"p0-{i}" for i in range(5)], partition=0)
    await kafka.produce(topic, [f"p1-{i}" for i in range(5)], partition=1)
    async with SharedStreamHarness(confirm_after=None) as h:
        w = h.add(KafkaSharedStreamTrigger([topic], kafka_config_id=kafka.conn_id, group_id=group))
        await w.wait_for_events(10)
        # One watcher: the harness binds its events in the order they were yielded.
        seqs = list(h._unconfirmed)
        partitions = [p["partition"] for p in w.payloads]
        h.confirm(seq for seq, p in zip(seqs, partitions, strict=True) if p == 1)
        assert await kafka.wait_committed(group, topic, {0: 0, 1: 5}, partitions=2) == {0: 0, 1: 5}
        h.confirm()
        assert await kafka.wait_committed(group, topic, {0: 5, 1: 5}, partitions=2) == {0: 5, 1: 5}


async def test_reject_and_unprocessable_go_to_dead_letter_topic(kafka):
    topic, dlq = kafka.name("in"), kafka.name("dlq")
    await kafka.create_topics(topic, dlq)
    group = kafka.name("g")
    await kafka.produce(topic, [{"ok": 1}, {"bad": True}, {"ok": 2}], key=b"k", headers=[("h", b"v")])
    await kafka.produce(topic, [b"\xff\xfe not utf-8", b"x" * 3000, {"ok": 3}])
    trigger = KafkaSharedStreamTrigger(
        [topic],
        kafka_config_id=kafka.conn_id,
        group_id=group,
        reject="value.bad",
        dead_letter_topic=dlq,
        max_payload_bytes=2000,
    )
    async with SharedStreamHarness(confirm_after=0.0) as h:
        w = h.add(trigger)
        await w.wait_for_events(3)
        assert [p["value"] for p in w.payloads] == [{"ok": 1}, {"ok": 2}, {"ok": 3}]
        assert await kafka.wait_committed(group, topic, {0: 6}) == {0: 6}
    dead = await kafka.read_all(dlq, expected=3)
    assert [r.value for r in dead] == [b'{"bad": true}', b"\xff\xfe not utf-8", b"x" * 3000]
    assert dead[0].key == b"k"
    headers = dict(dead[0].headers)
    assert headers["h"] == b"v"
    assert headers["x-shared-stream-topic"] == topic.encode()
    assert [dict(r.headers)["x-shared-stream-offset"] for r in dead] == [b"1", b"3", b"4"]


class StuckTrigger(KafkaSharedStreamTrigger):
    """A watcher whose filter hangs on its first message (a bug, or a stuck dependency)."""

    async def filter_shared_stream(self, shared_stream):
        async for _ in shared_stream:
            await asyncio.Event().wait()
        yield  # pragma: no cover


async def test_ack_timeout_redelivers_to_healthy_subscriber_via_seek(kafka):
    topic = kafka.name("t")
    await kafka.create_topics(topic)
    group = kafka.name("g")
    await kafka.produce(topic, ["a", "b", "c"])
    common = {"topics": [topic], "kafka_config_id": kafka.conn_id, "group_id": group}
    async with SharedStreamHarness(confirm_after=0.0, ack_timeout=1.0) as h:
        h.add(StuckTrigger(**common))
        healthy = h.add(KafkaSharedStreamTrigger(**common))
        await healthy.wait_for_events(3)
        # The stuck watcher holds every commit until the ack timeout fails it out.
        assert await kafka.committed(group, topic) == {0: 0}  # the start position only
        await healthy.wait_for_events(6, timeout=20)
        assert [p["offset"] for p in healthy.payloads] == [0, 1, 2, 0, 1, 2]
        assert await kafka.wait_committed(group, topic, {0: 3}) == {0: 3}


async def test_zero_subscriber_broadcast_is_read_again(kafka):
    from airflow.triggers.shared_stream import AdvanceItem, AdvanceOutcome

    topic = kafka.name("t")
    await kafka.create_topics(topic)
    group = kafka.name("g")
    await kafka.produce(topic, ["a", "b", "c"])
    trigger = KafkaSharedStreamTrigger([topic], kafka_config_id=kafka.conn_id, group_id=group)
    producer = KafkaSharedStreamTrigger.create_shared_stream_producer(trigger.serialize()[1])
    stream = producer.open_stream()
    try:
        first = [await anext(stream) for _ in range(3)]
        # What the manager hands over for events broadcast while nobody was subscribed.
        await producer.advance([AdvanceItem(payload, AdvanceOutcome(0, 0, 0)) for _, payload in first])
        again = [await asyncio.wait_for(anext(stream), 15) for _ in range(3)]
        assert [raw.envelope["value"] for raw, _ in again] == ["a", "b", "c"]
        assert await kafka.committed(group, topic) == {0: 0}  # the start position only
        await producer.advance([AdvanceItem(payload, AdvanceOutcome(1, 0, 0)) for _, payload in again])
        assert await kafka.wait_committed(group, topic, {0: 3}) == {0: 3}
    finally:
        await stream.aclose()
        await producer.aclose()


async def test_restart_resumes_from_committed_offsets(kafka):
    topic = kafka.name("t")
    await kafka.create_topics(topic)
    group = kafka.name("g")
    await kafka.produce(topic, [f"m{i}" for i in range(10)])
    trigger = KafkaSharedStreamTrigger([topic], kafka_config_id=kafka.conn_id, group_id=group)
    async with SharedStreamHarness(confirm_after=None) as h:
        w = h.add(trigger)
        await w.wait_for_events(10)
        h.confirm(list(h._unconfirmed)[:4])  # only the first four were persisted
        assert await kafka.wait_committed(group, topic, {0: 4}) == {0: 4}
    # The triggerer restarts: a new consumer of the same group picks up where the commit is.
    await kafka.produce(topic, ["m10", "m11"])
    async with SharedStreamHarness(confirm_after=0.0) as h:
        w = h.add(trigger)
        await w.wait_for_events(8)
        assert [p["value"] for p in w.payloads] == [f"m{i}" for i in range(4, 12)]
        assert await kafka.wait_committed(group, topic, {0: 12}) == {0: 12}
