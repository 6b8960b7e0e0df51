"""
What only a Kafka stream has, against noida-db and Tansu: the record envelope, per-partition
commits, the dead-letter copy's key and headers, and a restart resuming at the committed offset.
The behaviour every broker shares is in the contract (test_kafka_contract.py).
"""

from __future__ import annotations

import json

import pytest

from airflow_shared_stream.kafka.trigger import KafkaSharedStreamTrigger
from airflow_shared_stream.testing import SharedStreamHarness

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


async def test_the_payload_is_the_record_envelope(kafka):
    topic = kafka.name("orders")
    await kafka.create_topics(topic)
    group = kafka.name("g")
    await kafka.produce(
        topic, [{"n": 0}, {"n": 1}], key=b"k", headers=[("source", b"web"), ("bin", b"\xff\x00")]
    )
    async with SharedStreamHarness(confirm_after=0.0) as h:
        watcher = h.add(KafkaSharedStreamTrigger([topic], kafka_config_id=kafka.conn_id, group_id=group))
        await watcher.wait_for_events(2)
        first = watcher.payloads[0]
        assert first["value"] == {"n": 0}
        assert first["topic"] == topic
        assert first["partition"] == 0
        assert first["offset"] == 0
        assert isinstance(first["timestamp"], int)
        assert first["key"] == "k"
        assert first["headers"] == {"source": "web", "bin": "base64:/wA="}
        json.dumps(watcher.payloads)  # payloads must be JSON-able
        assert await kafka.wait_committed(group, topic, {0: 2}) == {0: 2}


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
