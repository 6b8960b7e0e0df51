"""The Kafka stream reads a topic's partitions side by side, not one after another (real brokers)."""

from __future__ import annotations

import itertools

import pytest

from airflow_shared_stream.kafka.trigger import KafkaSharedStreamTrigger
from airflow_shared_stream.testing import SharedStreamHarness

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

PARTITIONS = 3
PER_PARTITION = 300
WINDOW = 30


async def test_a_backlog_on_several_partitions_is_read_side_by_side(kafka):
    """
    With a window smaller than what the consumer buffered, every partition gets a share of it.

    Read partition by partition, the first partition's whole backlog went out before any record
    of the others: they waited behind it, and the drained partition was fetched again on its own.
    """
    topic = kafka.name("even")
    await kafka.create_topics(topic, partitions=PARTITIONS)
    for partition in range(PARTITIONS):
        await kafka.produce(topic, [f"p{partition}-{i}" for i in range(PER_PARTITION)], partition=partition)
    async with SharedStreamHarness(confirm_after=0.0) as harness:
        watcher = harness.add(
            KafkaSharedStreamTrigger([topic], kafka_config_id=kafka.conn_id, max_in_flight=WINDOW)
        )
        await watcher.wait_for_events(PARTITIONS * PER_PARTITION, timeout=90)
    partitions = [payload["partition"] for payload in watcher.payloads]
    longest_run = max(len(list(run)) for _, run in itertools.groupby(partitions))
    assert longest_run < PER_PARTITION // 2, f"{longest_run} records of one partition in a row"
    for partition in range(PARTITIONS):  # each partition still in offset order
        offsets = [p["offset"] for p in watcher.payloads if p["partition"] == partition]
        assert offsets == sorted(offsets)


async def test_a_large_window_takes_a_few_records_per_partition_at_a_time(kafka, monkeypatch):
    """
    However many credits are free, the stream asks aiokafka for a few records per partition.

    Each record aiokafka hands out stays alive until the stream has yielded it; a whole window
    at once outlives the garbage collector's young generations. Watched on the real consumer:
    every ``getmany`` it is asked stays within the per-partition bound, and every record arrives.
    """
    from aiokafka import AIOKafkaConsumer

    from airflow_shared_stream.kafka.fair_fetch import RECORDS_PER_PARTITION

    asked: list[int] = []
    getmany = AIOKafkaConsumer.getmany

    async def counting_getmany(self, *partitions, timeout_ms=0, max_records=None):
        if max_records is not None:  # the stream always bounds it
            asked.append(max_records)
        return await getmany(self, *partitions, timeout_ms=timeout_ms, max_records=max_records)

    monkeypatch.setattr(AIOKafkaConsumer, "getmany", counting_getmany)
    topic = kafka.name("chunked")
    await kafka.create_topics(topic, partitions=PARTITIONS)
    for partition in range(PARTITIONS):
        await kafka.produce(topic, [f"p{partition}-{i}" for i in range(PER_PARTITION)], partition=partition)
    async with SharedStreamHarness(confirm_after=0.0) as harness:
        watcher = harness.add(
            KafkaSharedStreamTrigger([topic], kafka_config_id=kafka.conn_id, max_in_flight=500)
        )
        await watcher.wait_for_events(PARTITIONS * PER_PARTITION, timeout=90)
    assert asked, "the stream never read from the consumer's buffer"
    assert max(asked) <= RECORDS_PER_PARTITION * PARTITIONS, f"asked for up to {max(asked)} records at once"
