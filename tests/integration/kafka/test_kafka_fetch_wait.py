"""
The test rig's noida-db holds an empty Fetch as Kafka does (tests/support/kafka_fetch_wait.py).

noida-db 0.2.3 answers a Fetch that finds nothing at once; Kafka and Tansu hold it up to
``fetch.max.wait.ms``. Without the shim an idle consumer on noida-db sends thousands of Fetch
requests a second and keeps a core busy in every Kafka test. These tests count requests (events),
not CPU time, and never depend on how long the shim holds a fetch.
"""

from __future__ import annotations

import asyncio
import collections
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.conn import AIOKafkaConnection
from aiokafka.protocol.fetch import FetchRequest

IDLE_SECONDS = 2.0
MOST_FETCHES = 40
"""At most this many Fetch requests from an idle consumer in :data:`IDLE_SECONDS` (with the shim
about 20 on noida-db, 4 on Tansu; without it, thousands on noida-db)."""


def count_requests(monkeypatch: pytest.MonkeyPatch) -> collections.Counter[str]:
    """Counts every request put on the wire in this process, by request class."""
    counts: collections.Counter[str] = collections.Counter()
    original = AIOKafkaConnection.send

    def send(self: Any, request: Any, expect_response: bool = True) -> Any:
        counts[type(request).__name__] += 1
        return original(self, request, expect_response)

    monkeypatch.setattr(AIOKafkaConnection, "send", send)
    return counts


@pytest.mark.parametrize("kafka_broker", ["noida-db"], indirect=True)
async def test_an_idle_consumer_on_noida_db_sends_a_few_dozen_fetches(kafka, monkeypatch):
    topic = kafka.name("t")
    await kafka.create_topics(topic)
    tp = TopicPartition(topic, 0)
    consumer = AIOKafkaConsumer(bootstrap_servers=kafka.bootstrap, enable_auto_commit=False)
    await consumer.start()
    try:
        consumer.assign([tp])
        await consumer.seek_to_end(tp)
        await consumer.position(tp)  # the fetch position is known: the fetcher is fetching
        counts = count_requests(monkeypatch)
        await asyncio.sleep(IDLE_SECONDS)
        fetches = counts[FetchRequest.__name__]
        assert fetches <= MOST_FETCHES, f"{fetches} Fetch requests from an idle consumer in {IDLE_SECONDS} s"

        # A record produced while fetches are held is still read (however late, within the wait below).
        await kafka.produce(topic, ["after-idle"])
        records: list[Any] = []
        async with asyncio.timeout(60):
            while not records:
                batch = await consumer.getmany(tp, timeout_ms=1000)
                records.extend(batch.get(tp, []))
        assert [r.value for r in records] == [b"after-idle"]
    finally:
        await consumer.stop()
