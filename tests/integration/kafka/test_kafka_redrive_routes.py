"""
Where a Kafka redrive writes, on real Kafka-protocol brokers: a dead-letter topic shared by two
streams sends each record home or leaves it (docs/redrive.rst).
"""

from __future__ import annotations

import json
import logging

import pytest
from aiokafka import AIOKafkaProducer

from airflow_shared_stream.common.redrive import redrive
from airflow_shared_stream.kafka.dead_letter import ORIGIN_HEADERS, REASON_HEADER, SIZE_HEADER
from tests.integration.kafka.conftest import KafkaSandbox
from tests.integration.kafka.test_kafka_redrive import dead_letters, source


async def test_a_dead_letter_topic_shared_by_two_streams_sends_each_record_home(kafka: KafkaSandbox) -> None:
    dlq, orders, payments = kafka.name("dlq"), kafka.name("orders"), kafka.name("payments")
    await kafka.create_topics(dlq, orders, payments)
    await dead_letters(kafka, dlq, orders, 3)
    await dead_letters(kafka, dlq, payments, 2)
    await dead_letters(kafka, dlq, orders, 1)

    summary = await redrive(source(kafka, dlq, source=orders))

    assert [json.loads(r.value)["n"] for r in await kafka.read_all(orders, 4)] == [0, 1, 2, 0]
    assert await kafka.read_all(payments, 1, timeout_ms=1000) == []  # none went to the other stream
    assert (summary.moved, summary.left_untouched) == (4, 2)

    # What the first redrive left is still there for the other stream's.
    summary = await redrive(source(kafka, dlq, source=payments))

    assert [json.loads(r.value)["n"] for r in await kafka.read_all(payments, 2)] == [0, 1]
    assert (summary.moved, summary.left_untouched) == (2, 4)
    assert len(await kafka.read_all(orders, 5, timeout_ms=1000)) == 4  # nothing more to orders


async def test_a_pointer_record_is_refused_by_name_with_where_the_original_is(
    kafka: KafkaSandbox, caplog: pytest.LogCaptureFixture
) -> None:
    """What our dead-lettering writes for a record too large to copy: no value, the original's place."""
    dlq, orders = kafka.name("dlq"), kafka.name("orders")
    await kafka.create_topics(dlq, orders)
    where = (orders, "0", "7")
    pointer = [
        *((name, value.encode()) for name, value in zip(ORIGIN_HEADERS, where, strict=True)),
        (REASON_HEADER, b"record too large for the dead-letter topic"),
        (SIZE_HEADER, b"2000000"),
    ]
    producer = AIOKafkaProducer(bootstrap_servers=kafka.bootstrap, acks="all")
    await producer.start()
    try:
        await producer.send_and_wait(dlq, value=None, key=b"k", headers=pointer)
    finally:
        await producer.stop()

    with caplog.at_level(logging.WARNING):
        summary = await redrive(source(kafka, dlq))

    assert (summary.moved, summary.failed) == (0, 1)
    assert f"the original is at {orders}/0@7" in caplog.text
    assert "read it from there and produce it again" in caplog.text
    assert await kafka.read_all(orders, 1, timeout_ms=1000) == []
