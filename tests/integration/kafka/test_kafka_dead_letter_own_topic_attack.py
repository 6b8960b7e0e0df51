"""
A Kafka stream whose dead-letter topic is one of the topics it reads (FAULT_MODEL classes 8, 15).

The redrive refuses a destination that is the topic it reads ("every message moved would come
straight back", docs/redrive.rst); the trigger took such a dead-letter topic.
"""

from __future__ import annotations

import asyncio

import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition

from airflow_shared_stream.common.errors import SharedStreamConfigurationError
from airflow_shared_stream.kafka.trigger import KafkaSharedStreamTrigger
from airflow_shared_stream.testing import SharedStreamHarness

pytestmark = [pytest.mark.integration, pytest.mark.timeout(90)]


async def _log_end(kafka, topic: str) -> int:  # type: ignore[no-untyped-def]
    consumer = AIOKafkaConsumer(bootstrap_servers=kafka.bootstrap, enable_auto_commit=False)
    await consumer.start()
    try:
        tp = TopicPartition(topic, 0)
        return (await consumer.end_offsets([tp]))[tp]
    finally:
        await consumer.stop()


async def test_a_stream_dead_lettering_to_a_topic_it_reads_does_not_loop(kafka) -> None:
    """
    Class 8 / 15: a watcher of ``orders`` with ``dead_letter_topic="orders"`` and a ``reject``.
    Each rejected record's copy lands in the topic the stream reads, is rejected again and copied
    again, for ever: the topic grows at broker speed and every other watcher of the stream fires
    again for each copy. It must be refused (as the redrive refuses the same route), not loop.
    """
    topic = kafka.name("orders")
    await kafka.create_topics(topic)
    try:
        trigger = KafkaSharedStreamTrigger(
            [topic], kafka_config_id=kafka.conn_id, dead_letter_topic=topic, reject="value.kind == 'bad'"
        )
    except SharedStreamConfigurationError:
        return  # refused when the Dag is parsed: no loop
    async with SharedStreamHarness(confirm_after=0.0) as triggerer:
        watcher = triggerer.add(trigger)
        await kafka.produce(topic, [{"kind": "bad"}, {"kind": "good"}])
        await watcher.wait_for_events(1)
        ends: list[int] = []

        async def grown() -> bool:
            ends.append(await _log_end(kafka, topic))
            return ends[-1] >= 20

        looped = False
        for _ in range(100):  # about 10 s: a loop passes 20 records in well under one
            if await grown():
                looped = True
                break
            await asyncio.sleep(0.1)
        assert not looped, f"the topic the stream reads grew with its own dead letters: ends {ends[-5:]}"
