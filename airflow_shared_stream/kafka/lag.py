"""
A Kafka stream's lag, from the end offsets the consumer last fetched: no request of its own.

The broker lag is what the stream's group has not committed; a watcher's is what it has not
passed, per partition, for the Streams page.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from aiokafka import AIOKafkaConsumer

if TYPE_CHECKING:
    from airflow_shared_stream.kafka.offsets import OffsetLedger
    from airflow_shared_stream.kafka.watchers import StreamWatchers


def broker_lag(consumer: AIOKafkaConsumer, ledger: OffsetLedger) -> int:
    """The partitions' end offsets minus the stream's committed offsets, summed."""
    lag = 0
    for tp in consumer.assignment():
        end = consumer.highwater(tp)
        committed = ledger.committed((tp.topic, tp.partition))
        if end is not None and committed is not None:
            lag += max(0, end - committed)
    return lag


def watcher_lag(consumer: AIOKafkaConsumer, watchers: StreamWatchers) -> dict[str, dict[str, int]]:
    """Each watcher's lag per partition: the end offset minus its position."""
    lag: dict[str, dict[str, int]] = {}
    for cursor in watchers.admitted():
        for tp in consumer.assignment():
            end, position = consumer.highwater(tp), cursor.next.get(tp)
            if end is not None and position is not None:
                lag.setdefault(cursor.label, {})[f"{tp.topic}/{tp.partition}"] = max(0, end - position)
    return lag
