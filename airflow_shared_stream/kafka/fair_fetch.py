"""
Take buffered records from every partition in turn, not one partition after another.

aiokafka's ``getmany(max_records=n)`` hands out the records it has buffered partition by
partition: with a credit window smaller than one partition's buffer, the stream drains the first
partition completely before it reads any record of the others. The other partitions wait (their
records get older while one busy partition has the whole window), and the drained partition is
fetched again on its own while the others are still full, so the consumer sends more, smaller
fetches; on a broker that answers a fetch at a partition's end at once, it sends them in a loop.
Sharing each fetch's credits between the partitions keeps them level, and they are fetched again
together.
"""

from __future__ import annotations

from typing import Any

from aiokafka import AIOKafkaConsumer, TopicPartition


async def fetch_evenly(
    consumer: AIOKafkaConsumer, max_records: int, timeout_ms: int
) -> dict[TopicPartition, list[Any]]:
    """
    Up to ``max_records`` buffered records, an equal share from each assigned partition first.

    Credits a partition leaves unused (it has fewer buffered) go to the others in the same call.
    With nothing buffered anywhere, waits up to ``timeout_ms`` as ``getmany`` does. Each
    partition's records stay in offset order.
    """
    partitions = consumer.assignment()
    if 1 < len(partitions) <= max_records:
        share = max_records // len(partitions)
        fetched: dict[TopicPartition, list[Any]] = {}
        taken = 0
        for tp in partitions:
            records = (await consumer.getmany(tp, max_records=share)).get(tp)
            if records:
                fetched[tp] = records
                taken += len(records)
        if taken:
            if taken < max_records:
                for tp, more in (await consumer.getmany(max_records=max_records - taken)).items():
                    fetched.setdefault(tp, []).extend(more)
            return fetched
    return await consumer.getmany(timeout_ms=timeout_ms, max_records=max_records)
