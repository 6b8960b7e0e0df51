"""
Where a Kafka redrive writes, on real Kafka-protocol brokers: a dead-letter topic shared by two
streams sends each record home or leaves it (docs/redrive.rst).
"""

from __future__ import annotations

import json

from airflow_shared_stream.common.redrive import redrive
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
