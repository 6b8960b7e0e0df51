"""
Attacks on the Kafka redrive's snapshot taken by a fetch (``fetched_log_ends``), on real brokers.

FAULT_MODEL classes 3, 11, 14, 15, 16: empty partitions, log starts past the last reported record,
transaction markers at the end of the log, partitions added during the redrive, a consumer tuned
to hold empty fetches. Each test says what it shows; a break is a strict ``xfail``.
"""

from __future__ import annotations

import asyncio
import json

import pytest
from aiokafka import AIOKafkaProducer, TopicPartition
from aiokafka.admin import NewPartitions, RecordsToDelete

from airflow_shared_stream.common.redrive import redrive
from airflow_shared_stream.kafka import log_bounds
from airflow_shared_stream.kafka.dead_letter import ORIGIN_HEADERS, REASON_HEADER
from airflow_shared_stream.kafka.redrive import default_group_id
from airflow_shared_stream.redrive import dead_letter_source
from tests.integration.kafka.conftest import KafkaSandbox
from tests.integration.kafka.test_kafka_cluster_changes import _admin
from tests.integration.kafka.test_kafka_redrive import dead_letters, source, topics

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


def _headers(origin: str) -> list[tuple[str, bytes]]:
    return [(ORIGIN_HEADERS[0], origin.encode()), (REASON_HEADER, b"why")]


async def test_a_redrive_of_a_topic_with_empty_partitions_moves_the_rest(kafka: KafkaSandbox) -> None:
    """
    Class 14 (held?): a dead-letter topic of three partitions, two of them empty. The fetch that
    takes an empty partition's end has no record to answer with: the end is 0 and the redrive
    moves the one partition's records, at once, not after the probe's rounds run out.
    """
    dlq, origin = kafka.name("dlq"), kafka.name("orders")
    await kafka.create_topics(dlq, partitions=3)
    await kafka.create_topics(origin)
    await kafka.produce(dlq, [{"n": i} for i in range(4)], partition=1, headers=_headers(origin))

    summary = await asyncio.wait_for(redrive(source(kafka, dlq)), timeout=30)

    assert (summary.examined, summary.moved) == (4, 4)
    assert await kafka.committed(default_group_id(dlq), dlq, partitions=3) == {0: None, 1: 4, 2: None}


async def test_records_larger_than_the_fetch_size_are_redriven_to_the_end(kafka: KafkaSandbox) -> None:
    """
    Class 6 / 16: the connection's ``max.partition.fetch.bytes`` is below the size of every
    dead-lettered record. Kafka returns the first batch whole however large (KIP-74), so the
    probe's fetch from the last record still answers with the end and the redrive moves them all.
    """
    conn = kafka.connection(
        "smallfetch", **{"max.partition.fetch.bytes": "1024", "auto.offset.reset": "earliest"}
    )
    dlq, origin = await topics(kafka)
    big = "x" * 20_000
    await kafka.produce(dlq, [{"n": i, "pad": big} for i in range(3)], headers=_headers(origin))

    summary = await asyncio.wait_for(redrive(dead_letter_source("kafka", dead_letter=dlq, conn_id=conn)), 30)

    assert (summary.examined, summary.moved) == (3, 3)


@pytest.mark.parametrize("kafka_broker", ["noida-db"], indirect=True)  # Tansu: no DeleteRecords
async def test_retention_between_the_list_offsets_and_the_fetch_still_gives_the_end(
    kafka: KafkaSandbox, monkeypatch: pytest.MonkeyPatch
) -> None:
    """
    Class 11 / 14: retention deletes every record between the probe's ListOffsets and its fetch,
    so the probe seeks below the new log start (offset out of range). The end must still be the
    log end, and the redrive reads nothing (the records are gone), without failing or hanging.
    """
    dlq, origin = await topics(kafka)
    await dead_letters(kafka, dlq, origin, 5)
    real = log_bounds.read_log_bounds
    tp = TopicPartition(dlq, 0)

    async def then_retention(consumer, lanes):  # type: ignore[no-untyped-def]
        bounds = await real(consumer, lanes)
        if tp in bounds:
            await _admin(kafka, lambda admin: admin.delete_records({tp: RecordsToDelete(5)}))
        return bounds

    monkeypatch.setattr(log_bounds, "read_log_bounds", then_retention)
    dead_letter_src = source(kafka, dlq)
    await dead_letter_src.open()
    try:
        snapshot = await dead_letter_src.snapshot()
    finally:
        await dead_letter_src.close()
    assert snapshot.bound == f"end offsets {{0: 5}} of {dlq!r}"
    monkeypatch.setattr(log_bounds, "read_log_bounds", real)
    summary = await asyncio.wait_for(redrive(source(kafka, dlq)), timeout=30)
    assert summary.moved == 0


@pytest.mark.parametrize("kafka_broker", ["noida-db"], indirect=True)  # Tansu has no transactions
@pytest.mark.parametrize("outcome", ["commit", "abort"])
async def test_a_dead_letter_topic_ending_in_a_transaction_marker_is_redriven_to_its_end(
    kafka: KafkaSandbox, outcome: str
) -> None:
    """
    Class 14 / 16: the last batch of the dead-letter topic is a control batch (a transaction's
    commit or abort marker), so the last record offset is not the end. The redrive moves the
    committed records (not the aborted ones), does not wait on the marker, and a second redrive
    finds nothing: no hang, no record moved twice.
    """
    dlq, origin = await topics(kafka)
    await dead_letters(kafka, dlq, origin, 3)
    producer = AIOKafkaProducer(bootstrap_servers=kafka.bootstrap, transactional_id=kafka.name("tx"))
    await producer.start()
    try:
        await producer.begin_transaction()
        for n in (3, 4):
            await producer.send_and_wait(dlq, value=json.dumps({"n": n}).encode(), headers=_headers(origin))
        if outcome == "commit":
            await producer.commit_transaction()
        else:
            await producer.abort_transaction()
    finally:
        await producer.stop()
    expected = 5 if outcome == "commit" else 3

    first = await asyncio.wait_for(redrive(source(kafka, dlq)), timeout=30)
    again = await asyncio.wait_for(redrive(source(kafka, dlq)), timeout=30)

    assert (first.examined, first.moved) == (expected, expected)
    assert (again.examined, again.moved) == (0, 0)
    assert len(await kafka.read_all(origin, expected, timeout_ms=3000)) == expected


@pytest.mark.parametrize("kafka_broker", ["noida-db"], indirect=True)  # Tansu: no CreatePartitions
async def test_a_partition_added_during_a_redrive_waits_for_the_next(
    kafka: KafkaSandbox, monkeypatch: pytest.MonkeyPatch
) -> None:
    """
    Class 14 / 15: a partition is added to the dead-letter topic after the snapshot and a record
    dead-lettered to it while the redrive runs. This redrive does not read it (bounded); the next
    reads it from its start (never skipped: the redrive group has no position there).
    """
    dlq, origin = await topics(kafka)
    await dead_letters(kafka, dlq, origin, 4)
    real = log_bounds.fetched_log_ends
    from airflow_shared_stream.kafka import redrive as kafka_redrive

    async def then_add(kwargs, lanes):  # type: ignore[no-untyped-def]
        ends = await real(kwargs, lanes)
        await _admin(kafka, lambda admin: admin.create_partitions({dlq: NewPartitions(2)}))
        await kafka.produce(dlq, [{"n": 99}], partition=1, headers=_headers(origin))
        return ends

    monkeypatch.setattr(kafka_redrive, "fetched_log_ends", then_add)
    first = await asyncio.wait_for(redrive(source(kafka, dlq)), timeout=30)
    monkeypatch.setattr(kafka_redrive, "fetched_log_ends", real)
    second = await asyncio.wait_for(redrive(source(kafka, dlq)), timeout=30)

    assert first.moved == 4
    assert (second.examined, second.moved) == (1, 1)
    assert await kafka.committed(default_group_id(dlq), dlq, partitions=2) == {0: 4, 1: 1}


async def test_a_stream_dead_lettering_to_its_own_source_is_redriven_once_per_redrive(
    kafka: KafkaSandbox,
) -> None:
    """
    Class 15: records whose origin header names the dead-letter topic itself (a stream that reads
    the topic it dead-letters to): every copy lands past the snapshot in the topic read. The
    redrive stops at its end: 3 moved, not chased. The copies carry no origin header (they are
    records of their topic now, as any a producer writes): the next redrive leaves them.
    """
    dlq = kafka.name("loop")
    await kafka.create_topics(dlq)
    await dead_letters(kafka, dlq, dlq, 3)

    first = await asyncio.wait_for(redrive(source(kafka, dlq)), timeout=30)
    second = await asyncio.wait_for(redrive(source(kafka, dlq)), timeout=30)

    assert (first.examined, first.moved) == (3, 3)
    assert (second.examined, second.moved, second.left) == (3, 0, 3)
    assert await kafka.committed(default_group_id(dlq), dlq) == {0: 6}
