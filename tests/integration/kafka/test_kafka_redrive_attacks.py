"""
Kafka redrive, attacked after issue 45 (FAULT_MODEL classes 1, 6, 8 and 15), on real
Kafka-protocol brokers.

Each test is a break found by an attacker who did not write the change; each is marked
``xfail(strict=True)`` until it is fixed (the fixer removes the mark).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Sequence

import pytest
from aiokafka import AIOKafkaProducer

from airflow_shared_stream.common.redrive import RedriveItem, redrive
from airflow_shared_stream.console.streams import group_streams
from airflow_shared_stream.kafka import KafkaSharedStreamTrigger
from airflow_shared_stream.kafka.dead_letter import ORIGIN_HEADERS, REASON_HEADER
from airflow_shared_stream.redrive import dead_letter_source
from airflow_shared_stream.testing import SharedStreamHarness
from tests.integration.kafka.conftest import KafkaSandbox
from tests.integration.kafka.test_kafka_dead_letter_sizing import create_limited_topic, require_enforced_limit
from tests.integration.kafka.test_kafka_redrive import dead_letters, source, topics

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]


async def test_a_record_that_carries_its_own_origin_header_is_redriven_to_its_real_topic(
    kafka: KafkaSandbox,
) -> None:
    """
    FAULT_MODEL 1 and 15 (identity of the origin; routed home). Whoever may produce to stream A's
    topic writes a record with the header ``x-shared-stream-topic: <stream B's topic>``. A's
    watcher rejects it; our dead-lettering appends the real origin headers after the record's
    own. The page's redrive (no ``source``: each record to the topic its header names) reads the
    first header and produces the record into stream B's topic, which stream B's Dags read: a
    dead letter sent into another stream's source, written by someone with no right on B.
    """
    orders, payments, dlq = kafka.name("orders"), kafka.name("payments"), kafka.name("dlq")
    await kafka.create_topics(orders, payments, dlq)
    producer = AIOKafkaProducer(bootstrap_servers=kafka.bootstrap, acks="all")
    await producer.start()
    try:
        await producer.send_and_wait(
            orders,
            value=json.dumps({"kind": "bad", "n": 1}).encode(),
            key=b"k",
            headers=[("x-shared-stream-topic", payments.encode())],
        )
    finally:
        await producer.stop()
    group = kafka.name("g")
    trigger = KafkaSharedStreamTrigger(
        [orders],
        kafka_config_id=kafka.conn_id,
        group_id=group,
        match="value.kind == 'good'",
        reject="value.kind == 'bad'",
        dead_letter_topic=dlq,
    )
    async with SharedStreamHarness(confirm_after=0.0) as h:
        w = h.add(trigger)
        assert await kafka.wait_committed(group, orders, {0: 1}) == {0: 1}
        assert w.error is None
    assert len(await kafka.read_all(dlq, expected=1)) == 1

    summary = await redrive(source(kafka, dlq))  # the Streams page's redrive: source left empty

    assert await kafka.read_all(payments, 1, timeout_ms=1000) == []  # never into another stream's topic
    assert summary.moved == 1
    assert len(await kafka.read_all(orders, 2)) == 2  # the original and its copy, home


async def test_the_pages_redrive_of_one_stream_never_moves_another_streams_dead_letters(
    kafka: KafkaSandbox,
) -> None:
    """
    FAULT_MODEL 15 (authorized per Dag and team for acting). Two Kafka streams (topics ``orders``
    and ``payments``, say of two teams) reject into one dead-letter topic. The Streams page
    authorizes a redrive of stream ``orders`` against the Dags of ``orders`` only, signs a grant
    with the stream's params (``source`` empty for Kafka) and the task moves what those params
    name: every record of the dead-letter topic, ``payments``' included, by a person who may not
    trigger ``payments``' Dags. A dry run also shows them ``payments``' messages as samples.
    """
    dlq, orders = await topics(kafka)
    payments = kafka.name("payments")
    await kafka.create_topics(payments)
    await dead_letters(kafka, dlq, orders, 2)
    await dead_letters(kafka, dlq, payments, 3)
    rows = [
        (
            1,
            "airflow_shared_stream.kafka.trigger.KafkaSharedStreamTrigger",
            KafkaSharedStreamTrigger(
                [topic], kafka_config_id=kafka.conn_id, dead_letter_topic=dlq
            ).serialize()[1],
            None,
        )
        for topic in (orders, payments)
    ]
    streams = {s.upstream["topics"][0]: s for s in group_streams(rows)}
    params = streams[orders].redrive_params  # what the page signs and the run carries for stream orders

    dry = await redrive(
        dead_letter_source(
            "kafka", source=params["source"], dead_letter=params["dead_letter"], conn_id=params["conn_id"]
        ),
        dry_run=True,
    )
    assert all(s["headers"].get("x-shared-stream-topic") != payments for s in dry.samples)
    summary = await redrive(
        dead_letter_source(
            "kafka", source=params["source"], dead_letter=params["dead_letter"], conn_id=params["conn_id"]
        )
    )

    assert await kafka.read_all(payments, 1, timeout_ms=1000) == []
    assert summary.moved == 2


async def test_a_filtered_redrive_on_a_topic_with_a_small_limit_moves_each_record_once(
    kafka: KafkaSandbox, request: pytest.FixtureRequest
) -> None:
    """
    FAULT_MODEL 6 (every write fits the broker's limits) and 8. The dead-letter topic's
    ``max.message.bytes`` is 1200; each dead letter (about 600 bytes) fits it, as our
    dead-lettering writes them one by one with a producer sized to the topic. A filtered redrive
    appends the skipped ones again with an unsized producer, which packs them into one batch the
    broker refuses; the partition stops there and nothing is committed, so the records it did
    move are read and copied again by the next redrive, and the next: the origin's watchers fire
    for each of them once per redrive, without end.
    """
    if kafka.broker.name == "tansu":
        # Strict, never a skip: if Tansu starts enforcing a topic's limit, this turns red.
        request.applymarker(
            pytest.mark.xfail(
                strict=True,
                reason="Tansu does not enforce a topic's own max.message.bytes (noida-db runs this test)",
            )
        )
    dlq, origin = kafka.name("dlq"), kafka.name("orders")
    await kafka.create_topics(origin)
    await create_limited_topic(kafka, dlq, 1200)
    await require_enforced_limit(kafka, dlq)
    producer = AIOKafkaProducer(bootstrap_servers=kafka.bootstrap, acks="all")
    await producer.start()
    try:
        for n in range(6):  # one by one, as a sized dead-letter producer writes them
            value = json.dumps({"n": n, "type": "a" if n >= 4 else "b", "pad": "x" * 500}).encode()
            ours = [(name, v.encode()) for name, v in zip(ORIGIN_HEADERS, (origin, "0", str(n)), strict=True)]
            await producer.send_and_wait(dlq, value=value, key=b"k", headers=[*ours, (REASON_HEADER, b"why")])
    finally:
        await producer.stop()

    for _ in range(3):
        await redrive(source(kafka, dlq), filter="value.type == 'a'")

    moved = [json.loads(r.value)["n"] for r in await kafka.read_all(origin, 2)]
    assert sorted(moved) == [4, 5]  # each once, however many redrives


async def test_a_redrive_stops_at_its_end_offsets_whatever_the_dead_letterers_clock(
    kafka: KafkaSandbox,
) -> None:
    """
    FAULT_MODEL 8 and 15 (bounded by a snapshot, never chasing its own copies). A record's
    timestamp (CreateTime) is the clock of the machine that produced it: the triggerer that
    dead-lettered it, not the worker that runs the redrive. With that triggerer's clock a minute
    behind, every copy a watcher rejects again lands past the end offsets with a timestamp older
    than the redrive's start, and the redrive reads it, copies it, and so on up to
    ``max_messages``: the accepting watchers of the stream fire for each round.
    """
    dlq, origin = await topics(kafka)
    await dead_letters(kafka, dlq, origin, 6)
    producer = AIOKafkaProducer(bootstrap_servers=kafka.bootstrap, acks="all")
    await producer.start()

    async def rejected_again_by_a_triggerer_a_minute_behind(step: str, items: Sequence[RedriveItem]) -> None:
        if step == "copied":
            for item in items:
                record = item.handle
                await producer.send_and_wait(
                    dlq,
                    value=record.value,
                    key=record.key,
                    headers=list(record.headers),
                    timestamp_ms=int(time.time() * 1000) - 60_000,
                )

    try:
        summary = await redrive(
            source(kafka, dlq),
            max_messages=50,
            checkpoint=rejected_again_by_a_triggerer_a_minute_behind,
            batch_size=2,
        )
    finally:
        await producer.stop()

    assert summary.moved == 6  # the snapshot's six, not one copy chased


# noida-db elects no new leader when the leader leaves its group (TEST_RIG.md): the redrive still
# working would rejoin for ever whenever the leader is the one that ends first. Kafka and Tansu
# elect one.
@pytest.mark.parametrize("kafka_broker", ["tansu"], indirect=True)
async def test_two_redrives_of_one_dead_letter_topic_at_once_move_each_record_once(
    kafka: KafkaSandbox,
) -> None:
    """
    FAULT_MODEL 15 (two redrives of one dead-letter source at once). The shipped redrive Dag runs
    one at a time, but the page's runs and a Dag of one's own (the documented way for anything the
    page does not offer) share the default group. On a queue the two hold each other's messages;
    on Kafka nothing is held: both read from the same committed offsets and each copies every
    record, so every watcher of the origin fires twice for each.
    """
    dlq, origin = await topics(kafka)
    await dead_letters(kafka, dlq, origin, 20)

    first, second = await asyncio.gather(
        redrive(source(kafka, dlq, source=origin), batch_size=2),
        redrive(source(kafka, dlq, source=origin), batch_size=2),
    )

    assert first.moved + second.moved == 20
    assert len(await kafka.read_all(origin, 20)) == 20
