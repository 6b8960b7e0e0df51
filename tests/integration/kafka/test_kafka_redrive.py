"""
Dead-letter redrive on real Kafka-protocol brokers (noida-db and Tansu, see conftest.py).

The dead-letter topic is written as our dead-lettering writes it: each record's key, value and
headers, plus the origin headers (kafka/dead_letter.py). Nothing is deleted from a topic, so
"still in the dead-letter topic" means "at or after the redrive group's committed offset".
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from aiokafka import AIOKafkaProducer

from airflow_shared_stream.common.redrive import redrive
from airflow_shared_stream.kafka.dead_letter import ORIGIN_HEADERS, REASON_HEADER
from airflow_shared_stream.kafka.errors import KafkaTopicNotFoundError
from airflow_shared_stream.kafka.redrive import default_group_id
from airflow_shared_stream.redrive import dead_letter_source
from tests.integration.kafka.conftest import KafkaSandbox
from tests.support.redrive_child import kill_between_copy_and_remove


async def dead_letters(kafka: KafkaSandbox, dlq: str, origin: str, count: int) -> list[dict[str, Any]]:
    """``count`` records on ``dlq`` as our dead-lettering writes them; returns what each carries."""
    producer = AIOKafkaProducer(bootstrap_servers=kafka.bootstrap, acks="all")
    await producer.start()
    records = []
    try:
        for i in range(count):
            value = json.dumps({"n": i, "type": "a" if i % 2 else "b"}).encode()
            key = f"k{i % 4}".encode()
            theirs = [("trace", f"t{i}".encode())]
            ours = [(name, v.encode()) for name, v in zip(ORIGIN_HEADERS, (origin, "0", str(i)), strict=True)]
            await producer.send(dlq, value=value, key=key, headers=[*theirs, *ours, (REASON_HEADER, b"why")])
            records.append({"value": value, "key": key, "headers": theirs})
        await producer.flush()
    finally:
        await producer.stop()
    return records


def source(kafka: KafkaSandbox, dlq: str, **kwargs: Any) -> Any:
    return dead_letter_source(
        "kafka",
        source=kwargs.pop("source", None),
        dead_letter=dlq,
        conn_id=kafka.conn_id,
        keep_origin_attributes=kwargs.pop("keep", False),
    )


async def topics(kafka: KafkaSandbox) -> tuple[str, str]:
    dlq, origin = kafka.name("dlq"), kafka.name("orders")
    await kafka.create_topics(dlq, origin)
    return dlq, origin


async def test_redrive_moves_every_record_with_its_key_and_headers(kafka: KafkaSandbox) -> None:
    dlq, origin = await topics(kafka)
    records = await dead_letters(kafka, dlq, origin, 15)

    summary = await redrive(source(kafka, dlq))  # the origin topic from each record's header

    assert (summary.moved, summary.skipped, summary.failed) == (15, 0, 0)
    moved = await kafka.read_all(origin, 15)
    assert [(r.value, r.key, list(r.headers)) for r in moved] == [
        (r["value"], r["key"], r["headers"]) for r in records
    ]
    assert await kafka.committed(default_group_id(dlq), dlq) == {0: 15}


async def test_keep_origin_attributes_keeps_the_origin_headers(kafka: KafkaSandbox) -> None:
    dlq, origin = await topics(kafka)
    await dead_letters(kafka, dlq, origin, 2)

    await redrive(source(kafka, dlq, source=origin, keep=True))

    moved = await kafka.read_all(origin, 2)
    assert [dict(r.headers)[ORIGIN_HEADERS[2]] for r in moved] == [b"0", b"1"]
    assert all(dict(r.headers)[REASON_HEADER] == b"why" for r in moved)


async def test_filter_moves_only_what_it_selects_and_passes_the_rest(kafka: KafkaSandbox) -> None:
    dlq, origin = await topics(kafka)
    await dead_letters(kafka, dlq, origin, 10)

    summary = await redrive(source(kafka, dlq), filter="value.type == 'a' && headers.trace != 't1'")

    assert (summary.moved, summary.skipped) == (4, 6)
    assert [json.loads(r.value)["n"] for r in await kafka.read_all(origin, 4)] == [3, 5, 7, 9]
    assert await kafka.committed(default_group_id(dlq), dlq) == {0: 10}


async def test_max_messages_moves_no_more_and_the_next_redrive_goes_on(kafka: KafkaSandbox) -> None:
    dlq, origin = await topics(kafka)
    await dead_letters(kafka, dlq, origin, 12)

    first = await redrive(source(kafka, dlq), max_messages=5)
    assert first.moved == 5
    assert await kafka.committed(default_group_id(dlq), dlq) == {0: 5}

    second = await redrive(source(kafka, dlq))
    assert second.moved == 7
    assert [json.loads(r.value)["n"] for r in await kafka.read_all(origin, 12)] == list(range(12))


async def test_dry_run_changes_nothing(kafka: KafkaSandbox) -> None:
    dlq, origin = await topics(kafka)
    await dead_letters(kafka, dlq, origin, 6)

    summary = await redrive(source(kafka, dlq), dry_run=True, filter="value.type == 'b'")

    assert (summary.moved, summary.skipped, summary.dry_run) == (3, 3, True)
    assert [s["value"]["n"] for s in summary.samples] == [0, 2, 4]
    assert await kafka.committed(default_group_id(dlq), dlq) == {0: None}
    assert await kafka.read_all(origin, 1, timeout_ms=1000) == []


async def test_a_redrive_killed_between_produce_and_commit_loses_nothing(kafka: KafkaSandbox) -> None:
    dlq, origin = await topics(kafka)
    records = await dead_letters(kafka, dlq, origin, 25)

    line = await asyncio.to_thread(
        kill_between_copy_and_remove, "kafka", dead_letter=dlq, conn_id=kafka.conn_id, source=origin
    )

    copied = int(line.split()[1])
    assert copied > 0
    at_origin = {r.value for r in await kafka.read_all(origin, copied)}
    assert len(at_origin) == copied
    committed = (await kafka.committed(default_group_id(dlq, origin), dlq))[0] or 0
    still_to_redrive = {r["value"] for r in records[committed:]}
    assert at_origin | still_to_redrive == {r["value"] for r in records}


async def test_a_missing_dead_letter_topic_is_named_in_a_clear_error(kafka: KafkaSandbox) -> None:
    with pytest.raises(KafkaTopicNotFoundError, match="no-such-topic"):
        await redrive(source(kafka, kafka.name("no-such-topic")))


async def test_a_record_that_cannot_be_copied_is_never_committed_past(kafka: KafkaSandbox) -> None:
    """A pointer record (too large to dead-letter whole: no value) stops its partition's commit."""
    dlq, origin = await topics(kafka)
    await dead_letters(kafka, dlq, origin, 2)
    ours = [(ORIGIN_HEADERS[0], origin.encode()), (REASON_HEADER, b"record too large")]
    producer = AIOKafkaProducer(bootstrap_servers=kafka.bootstrap, acks="all")
    await producer.start()
    try:
        await producer.send_and_wait(dlq, value=None, key=b"k", headers=ours)
        await producer.send_and_wait(dlq, value=b'{"n": 3}', key=b"k", headers=ours)
    finally:
        await producer.stop()

    summary = await redrive(source(kafka, dlq))

    assert (summary.moved, summary.failed) == (2, 2)  # the pointer, and the record held behind it
    assert await kafka.committed(default_group_id(dlq), dlq) == {0: 2}
    assert len(await kafka.read_all(origin, 3, timeout_ms=2000)) == 2
    again = await redrive(source(kafka, dlq))  # the next redrive stops at it again
    assert (again.moved, again.failed) == (0, 2)
