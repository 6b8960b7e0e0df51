"""
The Streams page's Kafka figures against a real broker: the lag each watcher's producer reports
per partition (written with the stream's figures) and the dead-letter topic's depth the page
reads from the broker.
"""

from __future__ import annotations

from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition

from airflow_shared_stream.console import backlog
from airflow_shared_stream.console.backlog import read_depth
from airflow_shared_stream.kafka.operations import dead_letter_depth
from airflow_shared_stream.kafka.redrive import default_group_id
from airflow_shared_stream.kafka.trigger import KafkaSharedStreamTrigger
from airflow_shared_stream.testing import SharedStreamHarness
from tests.support.waiting import eventually

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


async def kafka_dead_letter_depth(conn_id: str, topic: str) -> dict[str, Any]:
    """The depth the Streams page shows: the broker's count, read as the page reads it."""
    return await read_depth(dead_letter_depth(conn_id, topic))


def _lag(harness: SharedStreamHarness) -> dict[str, dict[str, int]]:
    figures = harness._scope.get("console.figures", {})
    return {w: p for stream in figures.values() for w, p in stream.lag.items()}


async def test_each_watchers_lag_per_partition_reaches_zero_when_it_has_everything(kafka: Any) -> None:
    topic = kafka.name("orders")
    await kafka.create_topics(topic, partitions=2)
    await kafka.produce(topic, [{"n": n} for n in range(3)], partition=0)
    await kafka.produce(topic, [{"n": n} for n in range(3, 6)], partition=1)
    async with SharedStreamHarness(confirm_after=0.2) as harness:
        everything = harness.add(KafkaSharedStreamTrigger(topics=[topic], kafka_config_id=kafka.conn_id))
        harness.add(
            KafkaSharedStreamTrigger(topics=[topic], kafka_config_id=kafka.conn_id, match="value.n < `0`")
        )
        await everything.wait_for_events(6)
        partitions = {f"{topic}/0", f"{topic}/1"}
        await eventually(
            lambda: _lag(harness),
            lambda lag: (
                len(lag) == 2 and all(set(p) == partitions and not any(p.values()) for p in lag.values())
            ),
            timeout=30,
            what="both watchers' lag on both partitions at 0",
        )


async def test_a_watcher_that_settles_nothing_shows_its_lag_without_a_commit(kafka: Any) -> None:
    topic = kafka.name("orders")
    await kafka.create_topics(topic)
    async with SharedStreamHarness(confirm_after=0.0) as harness:
        harness.persisting = False  # no event is ever persisted: nothing settles, nothing commits
        await kafka.produce(topic, [{"n": n} for n in range(3)], partition=0)
        watcher = harness.add(KafkaSharedStreamTrigger(topics=[topic], kafka_config_id=kafka.conn_id))
        await watcher.wait_for_events(3)
        await eventually(
            lambda: _lag(harness),
            lambda lag: list(lag.values()) == [{f"{topic}/0": 3}],
            timeout=30,
            what="a lag of 3 on the partition",
        )
        harness.persisting = True
        await eventually(
            lambda: _lag(harness),
            lambda lag: list(lag.values()) == [{f"{topic}/0": 0}],
            timeout=30,
            what="the lag back at 0 once the events are persisted",
        )


async def test_dead_letter_depth_is_what_the_redrive_group_has_not_taken(
    kafka: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(backlog, "CACHE_SECONDS", 0.0)  # every read asks the broker
    dlq = kafka.name("orders-dlq")
    await kafka.create_topics(dlq, partitions=2)
    assert await kafka_dead_letter_depth(kafka.conn_id, dlq) == {"depth": 0}
    for n in range(5):  # one record a batch: Tansu answers ListOffsets(latest) per batch, not record
        await kafka.produce(dlq, [{"n": n}], partition=n % 2)
    assert await kafka_dead_letter_depth(kafka.conn_id, dlq) == {"depth": 5}
    # A redrive that took the first two records of partition 0 committed past them.
    redrive_group = AIOKafkaConsumer(bootstrap_servers=kafka.bootstrap, group_id=default_group_id(dlq))
    await redrive_group.start()
    try:
        redrive_group.assign([TopicPartition(dlq, 0)])
        await redrive_group.commit({TopicPartition(dlq, 0): 2})
    finally:
        await redrive_group.stop()
    assert await kafka_dead_letter_depth(kafka.conn_id, dlq) == {"depth": 3}
    assert (await kafka_dead_letter_depth(kafka.conn_id, kafka.name("missing")))["error"]
