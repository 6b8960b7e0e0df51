"""
Kafka redrive bounds on real Kafka-protocol brokers: the snapshot, skipped records, memory.

Issue 45 items 1, 5 and 10: a redrive stops at the end offsets it started with (copies a
watcher rejects again come back to the dead-letter topic and wait for the next redrive), the
records a filter skips stay reachable by the next redrive, and a dry run holds one batch at a
time whatever the topic's depth.
"""

from __future__ import annotations

import asyncio
import gc
import json
import weakref
from collections.abc import Sequence
from typing import Any

import pytest
from aiokafka import AIOKafkaProducer

from airflow_shared_stream.common.redrive import RedriveItem, redrive
from airflow_shared_stream.kafka.dead_letter import ORIGIN_HEADERS, REASON_HEADER
from airflow_shared_stream.kafka.redrive import default_group_id
from tests.integration.kafka.conftest import KafkaSandbox
from tests.integration.kafka.test_kafka_redrive import dead_letters, source, topics
from tests.support.redrive_child import kill_between_copy_and_remove


async def test_a_redrive_stops_at_the_end_offsets_it_started_with(kafka: KafkaSandbox) -> None:
    """Every copy comes straight back (a watcher rejects it again): the redrive never chases it."""
    dlq, origin = await topics(kafka)
    await dead_letters(kafka, dlq, origin, 6)
    producer = AIOKafkaProducer(bootstrap_servers=kafka.bootstrap, acks="all")
    await producer.start()

    async def rejected_again(step: str, items: Sequence[RedriveItem]) -> None:
        if step == "copied":
            for item in items:
                record = item.handle
                await producer.send_and_wait(
                    dlq, value=record.value, key=record.key, headers=list(record.headers)
                )

    try:
        summary = await redrive(source(kafka, dlq), max_messages=50, checkpoint=rejected_again, batch_size=2)
    finally:
        await producer.stop()

    assert summary.moved == 6  # not one copy chased
    assert await kafka.committed(default_group_id(dlq), dlq) == {0: 6}
    assert summary.examined == 6
    again = await redrive(source(kafka, dlq), dry_run=True)  # the copies that came back: the next one's
    assert (again.examined, again.moved, again.left) == (6, 6, 6)


async def test_the_snapshot_is_the_log_end_however_the_records_were_batched(kafka: KafkaSandbox) -> None:
    """
    Tansu 0.6.0 answers ListOffsets (latest) with the first offset of a partition's last batch
    plus one; a snapshot taken from it would leave the rest of that batch to the next redrive.
    The end a fetch reports is the log end on both brokers.
    """
    dlq, origin = await topics(kafka)
    await dead_letters(kafka, dlq, origin, 6)  # sent without waiting: batched
    await dead_letters(kafka, dlq, origin, 3)
    dead_letter_source = source(kafka, dlq)
    await dead_letter_source.open()
    try:
        snapshot = await dead_letter_source.snapshot()
    finally:
        await dead_letter_source.close()

    assert snapshot.bound == f"end offsets {{0: 9}} of {dlq!r}"
    assert snapshot.depth is None


@pytest.mark.parametrize("kafka_broker", ["noida-db"], indirect=True)  # Tansu has no transactions
async def test_a_redrive_ends_at_the_last_stable_offset_while_a_transaction_is_open(
    kafka: KafkaSandbox,
) -> None:
    """
    Under ``read_committed`` (the default) a consumer reads no further than the last stable
    offset; a snapshot at the high watermark, past an open transaction's records, would wait for
    records it cannot read until that transaction ends.
    """
    dlq, origin = await topics(kafka)
    await dead_letters(kafka, dlq, origin, 6)
    producer = AIOKafkaProducer(bootstrap_servers=kafka.bootstrap, transactional_id=kafka.name("tx"))
    await producer.start()
    try:
        await producer.begin_transaction()
        for n in (6, 7):
            headers = [(ORIGIN_HEADERS[0], origin.encode()), (REASON_HEADER, b"why")]
            await producer.send_and_wait(dlq, value=json.dumps({"n": n}).encode(), headers=headers)

        summary = await asyncio.wait_for(redrive(source(kafka, dlq)), timeout=60)  # a hang fails

        await producer.abort_transaction()
    finally:
        await producer.stop()
    assert (summary.examined, summary.moved) == (6, 6)
    assert await kafka.committed(default_group_id(dlq), dlq) == {0: 6}


async def test_a_filtered_redrive_leaves_the_skipped_records_to_the_next_one(kafka: KafkaSandbox) -> None:
    dlq, origin = await topics(kafka)
    await dead_letters(kafka, dlq, origin, 10)

    first = await redrive(source(kafka, dlq), filter="value.type == 'a'")

    assert (first.moved, first.skipped) == (5, 5)
    second = await redrive(source(kafka, dlq))
    assert second.moved == 5  # the skipped ones, still reachable
    moved = [json.loads(r.value)["n"] for r in await kafka.read_all(origin, 10)]
    assert sorted(moved) == list(range(10))
    assert (first.examined, first.left, second.examined, second.left) == (10, 5, 5, 0)


async def test_a_dry_run_holds_one_batch_whatever_the_depth(kafka: KafkaSandbox) -> None:
    """Measured by the records still alive after each read, not by time or process memory."""
    dlq, origin = await topics(kafka)
    await dead_letters(kafka, dlq, origin, 400)
    dead_letter_source = source(kafka, dlq)
    read = dead_letter_source.read
    seen: list[weakref.ref[Any]] = []
    most_alive = 0

    async def read_and_count(limit: int) -> Sequence[RedriveItem]:
        nonlocal most_alive
        gc.collect()
        most_alive = max(most_alive, sum(1 for ref in seen if ref() is not None))
        batch = await read(limit)
        seen.extend(weakref.ref(item.handle) for item in batch)
        return batch

    dead_letter_source.read = read_and_count
    summary = await redrive(dead_letter_source, dry_run=True, max_messages=1000, filter="value.n == `-1`")

    assert most_alive <= 10  # the batch being judged, never the topic
    assert (summary.examined, summary.skipped, summary.moved) == (400, 400, 0)


# noida-db never evicts a member killed without leaving (TEST_RIG.md): the next redrive would
# wait for its group for ever. Kafka and Tansu evict it after its session timeout.
@pytest.mark.parametrize("kafka_broker", ["tansu"], indirect=True)
async def test_a_filtered_redrive_killed_between_append_and_commit_loses_nothing(kafka: KafkaSandbox) -> None:
    """
    SIGKILL once the skipped records were appended again, before the group commits past them. The
    next redrive joins the group once the killed member's session timed out (Kafka, Tansu).
    """
    dlq, origin = await topics(kafka)
    records = await dead_letters(kafka, dlq, origin, 10)

    line = await asyncio.to_thread(
        kill_between_copy_and_remove,
        "kafka",
        run={"filter": "value.type == 'a'", "stop_after": "append"},
        dead_letter=dlq,
        conn_id=kafka.conn_id,
        source=origin,
    )

    assert line == "COPIED 5"
    assert await kafka.committed(default_group_id(dlq), dlq) == {0: None}
    again = await redrive(source(kafka, dlq, source=origin))  # everything, the appended copies too
    assert again.moved == 15  # the 10 originals and the 5 skipped ones appended: duplicates, no loss
    at_origin = {r.value for r in await kafka.read_all(origin, 20)}
    assert at_origin == {r["value"] for r in records}
