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

Nor does the stream take more than a few records per partition at a time. aiokafka builds a
``ConsumerRecord`` for every record it hands out, and the stream yields them one by one, giving
the watchers their turn in between: a whole window handed out at once stays alive until its last
record is yielded, long enough to outlive the garbage collector's young generations. What
outlives them is promoted to the oldest generation, and every promotion brings the next full
collection nearer, which walks the triggerer's whole heap, Airflow's modules included. A few
records at a time are yielded, and freed, while they are still young.
"""

from __future__ import annotations

from typing import Any

from aiokafka import AIOKafkaConsumer, TopicPartition

RECORDS_PER_PARTITION = 32
"""Most records taken from the buffer per assigned partition in one call (see the module docstring)."""


async def fetch_evenly(
    consumer: AIOKafkaConsumer, max_records: int, timeout_ms: int
) -> dict[TopicPartition, list[Any]]:
    """
    Up to ``max_records`` buffered records, an equal share from each assigned partition first.

    No more than :data:`RECORDS_PER_PARTITION` per assigned partition, whatever ``max_records``
    allows. Credits a partition leaves unused (it has fewer buffered) go to the others in the same
    call. With nothing buffered anywhere, waits up to ``timeout_ms`` as ``getmany`` does. Each
    partition's records stay in offset order.
    """
    partitions = consumer.assignment()
    max_records = min(max_records, RECORDS_PER_PARTITION * max(1, len(partitions)))
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
