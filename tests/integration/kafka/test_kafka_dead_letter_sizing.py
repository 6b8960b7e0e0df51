"""
Dead letters sized to the dead-letter topic, and pointers that every broker takes (issue 46, 1-2).

Against noida-db and Tansu; the topic-limit test needs a broker that enforces a topic's own
``max.message.bytes`` (noida-db does), and says so loudly on one that does not.
"""

from __future__ import annotations

import json

import pytest
from aiokafka import AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import MessageSizeTooLargeError

from airflow_shared_stream.kafka import KafkaSharedStreamTrigger
from airflow_shared_stream.testing import SharedStreamHarness
from tests.integration.kafka.test_kafka_loss_paths import value_that_fits_only_without_origin_headers

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

TOPIC_LIMIT = 1200
"""The dead-letter topic's max.message.bytes: below aiokafka's batch size, above each copy."""


async def test_a_keyless_record_too_large_for_the_dead_letter_topic_becomes_a_pointer(kafka):
    """A pointer of a record without a key carries its origin as key; the stream goes on (item 1)."""
    topic, dlq = kafka.name("t"), kafka.name("dlq")
    await kafka.create_topics(topic, dlq)
    group = kafka.name("g")
    headers = [("trace", b"abc")]
    big = value_that_fits_only_without_origin_headers(headers)
    producer = AIOKafkaProducer(bootstrap_servers=kafka.bootstrap, acks="all")
    await producer.start()
    try:
        await producer.send_and_wait(topic, value=big, key=None, headers=headers)
    finally:
        await producer.stop()
    await kafka.produce(topic, ["after"])
    trigger = KafkaSharedStreamTrigger(
        [topic], kafka_config_id=kafka.conn_id, group_id=group, dead_letter_topic=dlq
    )
    async with SharedStreamHarness(confirm_after=0.0) as h:
        w = h.add(trigger)
        await w.wait_for_events(1, timeout=60)
        assert [p["value"] for p in w.payloads] == ["after"]
        assert await kafka.wait_committed(group, topic, {0: 2}) == {0: 2}
        assert w.error is None
    (pointer,) = await kafka.read_all(dlq, expected=1)
    assert pointer.value is None
    assert pointer.key == f"{topic}/0/0".encode()
    fields = dict(pointer.headers)
    assert fields["x-shared-stream-offset"] == b"0"
    assert b"too large" in fields["x-shared-stream-dead-letter-reason"]


async def create_limited_topic(kafka, name: str, limit: int) -> None:
    admin = AIOKafkaAdminClient(bootstrap_servers=kafka.bootstrap)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(name, 1, 1, topic_configs={"max.message.bytes": str(limit)})])
    finally:
        await admin.close()


async def require_enforced_limit(kafka, topic: str) -> None:
    """Fail loudly on a broker that does not enforce the topic's own limit (nothing to test)."""
    producer = AIOKafkaProducer(bootstrap_servers=kafka.bootstrap, acks="all")
    await producer.start()
    try:
        with pytest.raises(MessageSizeTooLargeError):
            await producer.send_and_wait(topic, value=b"x" * (TOPIC_LIMIT * 2))
    finally:
        await producer.stop()


async def test_records_that_fit_the_dead_letter_topic_are_copied_whole(kafka, request):
    """Rejected records that each fit the topic's max.message.bytes arrive whole (item 2)."""
    if kafka.broker.name == "tansu":
        # Strict: if Tansu starts enforcing a topic's limit, this turns red and the marker goes.
        request.applymarker(
            pytest.mark.xfail(
                strict=True,
                reason="Tansu does not enforce a topic's own max.message.bytes (noida-db runs this test)",
            )
        )
    topic, dlq = kafka.name("t"), kafka.name("dlq")
    await kafka.create_topics(topic)
    await create_limited_topic(kafka, dlq, TOPIC_LIMIT)
    await require_enforced_limit(kafka, dlq)
    group = kafka.name("g")
    values = [json.dumps({"kind": "bad", "n": n, "pad": "x" * 590}) for n in range(10)]
    assert {len(v) for v in values} == {len(values[0])}
    await kafka.produce(topic, [*values, json.dumps({"kind": "good"})], key=b"k")
    trigger = KafkaSharedStreamTrigger(
        [topic],
        kafka_config_id=kafka.conn_id,
        group_id=group,
        match="value.kind == 'good'",
        reject="value.kind == 'bad'",
        dead_letter_topic=dlq,
    )
    async with SharedStreamHarness(confirm_after=0.0) as h:
        w = h.add(trigger)
        await w.wait_for_events(1, timeout=60)
        assert await kafka.wait_committed(group, topic, {0: 11}) == {0: 11}
        assert w.error is None
    copies = await kafka.read_all(dlq, expected=10)
    assert [c.value for c in copies] == [v.encode() for v in values]


async def test_a_pointer_whose_key_does_not_fit_the_topic_goes_without_it(kafka, request):
    """A key under 1 KiB that makes the pointer too large gives way to the origin's, not retried forever."""
    if kafka.broker.name == "tansu":
        request.applymarker(
            pytest.mark.xfail(
                strict=True,
                reason="Tansu does not enforce a topic's own max.message.bytes (noida-db runs this test)",
            )
        )
    topic, dlq = kafka.name("t"), kafka.name("dlq")
    await kafka.create_topics(topic)
    await create_limited_topic(kafka, dlq, TOPIC_LIMIT)
    await require_enforced_limit(kafka, dlq)
    group = kafka.name("g")
    key = b"k" * 1000
    await kafka.produce(topic, [json.dumps({"kind": "bad", "pad": "x" * 600})], key=key)
    await kafka.produce(topic, [json.dumps({"kind": "good"})])
    trigger = KafkaSharedStreamTrigger(
        [topic],
        kafka_config_id=kafka.conn_id,
        group_id=group,
        match="value.kind == 'good'",
        reject="value.kind == 'bad'",
        dead_letter_topic=dlq,
    )
    async with SharedStreamHarness(confirm_after=0.0) as h:
        w = h.add(trigger)
        await w.wait_for_events(1, timeout=60)
        assert await kafka.wait_committed(group, topic, {0: 2}) == {0: 2}
        assert w.error is None
    (pointer,) = await kafka.read_all(dlq, expected=1)
    assert (pointer.key, pointer.value) == (f"{topic}/0/0".encode(), None)
    assert dict(pointer.headers)["x-shared-stream-offset"] == b"0"
    assert b"too large" in dict(pointer.headers)["x-shared-stream-dead-letter-reason"]


@pytest.mark.parametrize("limit", [160, 250])
async def test_a_dead_letter_topic_too_small_even_for_a_pointer_never_fails_the_stream(kafka, request, limit):
    """
    FAULT_MODEL class 6 (attack on issue 46 item 1). The dead-letter topic's max.message.bytes is
    so small that even a pointer with an empty key (origin headers, reason, size: about 325
    bytes) does not fit. Its refusal escaped as a stream failure: the retried stream read the
    same record again, for ever, and the next record never fired. The stream must go on: at 250
    a pointer with the origin headers alone (about 175 bytes) fits and is written; at 160 nothing
    fits, and the record is passed, logged at ERROR.
    """
    if kafka.broker.name == "tansu":
        request.applymarker(
            pytest.mark.xfail(
                strict=True,
                reason="Tansu does not enforce a topic's own max.message.bytes (noida-db runs this test)",
            )
        )
    topic, dlq = kafka.name("t"), kafka.name("dlq")
    await kafka.create_topics(topic)
    await create_limited_topic(kafka, dlq, limit)
    producer = AIOKafkaProducer(bootstrap_servers=kafka.bootstrap, acks="all")
    await producer.start()
    try:
        with pytest.raises(MessageSizeTooLargeError):
            await producer.send_and_wait(dlq, value=b"x" * (limit * 2))
    finally:
        await producer.stop()
    group = kafka.name("g")
    await kafka.produce(topic, [json.dumps({"kind": "bad", "pad": "x" * 300})])
    await kafka.produce(topic, [json.dumps({"kind": "good"})])
    trigger = KafkaSharedStreamTrigger(
        [topic],
        kafka_config_id=kafka.conn_id,
        group_id=group,
        match="value.kind == 'good'",
        reject="value.kind == 'bad'",
        dead_letter_topic=dlq,
    )
    async with SharedStreamHarness(confirm_after=0.0) as h:
        w = h.add(trigger)
        await w.wait_for_events(1, timeout=30)
        assert await kafka.wait_committed(group, topic, {0: 2}) == {0: 2}
        assert w.error is None
    if limit == 250:
        (pointer,) = await kafka.read_all(dlq, expected=1)
        assert (pointer.key, pointer.value) in {(f"{topic}/0/0".encode(), None), (b"", None)}
        assert dict(pointer.headers)["x-shared-stream-offset"] == b"0"
