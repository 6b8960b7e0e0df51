"""
Positions when the cluster changes under a stream (FAULT_MODEL class 14), against real brokers.

Retention deleting past a position, a coordinator that is loading, a topic deleted and created
again, partitions added while the stream runs: each is "never a silent skip; read from the start
of what is new, or say loudly what was lost". Each :class:`SharedStreamHarness` is one triggerer.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from typing import Any

import pytest
from aiokafka import TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewPartitions, RecordsToDelete

from airflow_shared_stream.kafka import cluster_watch
from airflow_shared_stream.kafka.trigger import KafkaSharedStreamTrigger
from airflow_shared_stream.kafka.watchers import watcher_group_id
from airflow_shared_stream.testing import SharedStreamHarness, Watcher
from tests.support.kafka_proxy import KafkaProtocolProxy

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

LATEST = {"auto.offset.reset": "latest"}
POSITIONS_LOG = "airflow_shared_stream.kafka"


async def _admin(kafka: Any, act: Callable[[AIOKafkaAdminClient], Any]) -> Any:
    admin = AIOKafkaAdminClient(bootstrap_servers=kafka.bootstrap)
    await admin.start()
    try:
        return await act(admin)
    finally:
        await admin.close()


async def _until(condition: Callable[[], bool], what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out after {timeout}s waiting for {what}"
        await asyncio.sleep(0.05)


async def _received_up_to(watcher: Watcher, last: Any, key: str = "i") -> list[Any]:
    """What ``watcher`` received, once the record whose ``key`` is ``last`` came (the marker)."""
    await _until(lambda: any(p["value"][key] == last for p in watcher.payloads), f"{key}={last}")
    return [p["value"][key] for p in watcher.payloads]


# -- 5: retention deletes past a position ------------------------------------------------------


@pytest.mark.parametrize("kafka_broker", ["noida-db"], indirect=True)  # Tansu: no DeleteRecords
async def test_a_position_below_the_log_start_moves_to_it_loudly_and_restarts_skip_nothing(kafka, caplog):
    """
    A watcher stopped at 10; retention then deleted 0-19. Its next start must read from the log
    start (20), not let the client reset to ``latest``, and say at WARNING that 10-19 are gone.
    The position moved there is committed: a second restart resumes from it and skips nothing.
    """
    caplog.set_level(logging.INFO, logger=POSITIONS_LOG)
    topic = kafka.name("t")
    await kafka.create_topics(topic)
    group = kafka.name("g")
    trigger = KafkaSharedStreamTrigger(
        [topic], kafka_config_id=kafka.connection("latest", **LATEST), group_id=group
    )
    own_group = watcher_group_id(group, trigger.watcher_digest())
    await kafka.produce(topic, [{"i": i} for i in range(30)])
    await kafka.commit(group, topic, {0: 10})
    await kafka.commit(own_group, topic, {0: 10})
    tp = TopicPartition(topic, 0)
    await _admin(kafka, lambda admin: admin.delete_records({tp: RecordsToDelete(20)}))
    async with SharedStreamHarness(confirm_after=0.0) as first_start:
        w = first_start.add(trigger)
        await kafka.wait_committed(own_group, topic, {0: 20}, timeout=10)
        await kafka.produce(topic, [{"i": 30}])
        assert await _received_up_to(w, 30) == list(range(20, 31)), "retained records were skipped"
        assert await kafka.wait_committed(own_group, topic, {0: 31}) == {0: 31}
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("10-19" in message and "retention" in message for message in warnings), warnings
    await kafka.produce(topic, [{"i": i} for i in range(31, 35)])  # while nothing runs
    async with SharedStreamHarness(confirm_after=0.0) as second_start:
        again = second_start.add(trigger)
        await kafka.produce(topic, [{"i": 35}])
        assert await _received_up_to(again, 35) == list(range(31, 36)), "the restart skipped"


# -- 6: a coordinator that is loading ----------------------------------------------------------


async def test_a_coordinator_loading_answer_is_asked_again_not_taken_for_a_new_watcher(kafka):
    """
    Stands in for FIDELITY.md's row "Kafka coordinator loading / moved" (never happens on
    noida-db or Tansu; a real coordinator answers OffsetFetch v2+ with a request-level error code
    and no partitions while it loads the group's offsets, or after it moved). A watcher moved
    here with its position at 10, onto a stream that reads at 20, must get 10-19: the loading
    answers are asked again, never read as "this watcher has no position".
    """
    topic = kafka.name("t")
    await kafka.create_topics(topic)
    group = kafka.name("g")
    await kafka.produce(topic, [{"i": i} for i in range(20)])
    await kafka.commit(group, topic, {0: 20})  # where the stream reads on this triggerer
    async with KafkaProtocolProxy(kafka.broker.port) as proxy:
        conn_id = kafka.connection("proxy", **{"bootstrap.servers": proxy.bootstrap})
        trigger = KafkaSharedStreamTrigger([topic], kafka_config_id=conn_id, group_id=group)
        own_group = watcher_group_id(group, trigger.watcher_digest())
        await kafka.commit(own_group, topic, {0: 10})  # where the triggerer that died left it
        proxy.loading[own_group] = 3
        async with SharedStreamHarness(confirm_after=0.0) as triggerer:
            moved = triggerer.add(trigger)
            await kafka.produce(topic, [{"i": 20}])
            assert await _received_up_to(moved, 20) == list(range(10, 21)), "records 10-19 lost"
            assert proxy.loading_answered == 3
            assert await kafka.wait_committed(own_group, topic, {0: 21}) == {0: 21}
            assert moved.error is None


# -- 7: a topic deleted and created again ------------------------------------------------------


@pytest.mark.parametrize("kafka_broker", ["tansu"], indirect=True)  # noida-db: no topic ids
async def test_a_topic_created_again_while_the_stream_runs_is_read_from_its_start(kafka, monkeypatch, caplog):
    """
    The stream read 20 records; the topic is deleted, created again and 25 records produced to
    it, offsets 0-24 again. Reading on at 20 skips 0-19 with no error, even with
    ``auto.offset.reset=earliest``: the new topic (its new topic id) must be read from its start,
    and said at WARNING.
    """
    monkeypatch.setattr(cluster_watch, "CLUSTER_CHECK_INTERVAL", 0.2)
    # No check while the topic is gone: only its new id can show it was created again.
    checking = asyncio.Event()
    checking.set()
    due = cluster_watch.ClusterWatch.due
    monkeypatch.setattr(cluster_watch.ClusterWatch, "due", lambda watch: checking.is_set() and due(watch))
    caplog.set_level(logging.INFO, logger=POSITIONS_LOG)
    topic = kafka.name("t")
    await kafka.create_topics(topic)
    group = kafka.name("g")
    trigger = KafkaSharedStreamTrigger([topic], kafka_config_id=kafka.conn_id, group_id=group)
    own_group = watcher_group_id(group, trigger.watcher_digest())
    async with SharedStreamHarness(confirm_after=0.0) as triggerer:
        w = triggerer.add(trigger)
        await kafka.produce(topic, [{"round": 1, "i": i} for i in range(20)])
        await w.wait_for_events(20)
        assert await kafka.wait_committed(own_group, topic, {0: 20}) == {0: 20}
        checking.clear()
        await _admin(kafka, lambda admin: admin.delete_topics([topic]))
        await kafka.create_topics(topic)
        await kafka.produce(topic, [{"round": 2, "i": i} for i in range(25)])
        checking.set()

        def second() -> list[int]:
            return [p["value"]["i"] for p in w.payloads if p["value"]["round"] == 2]

        # Records 20-24 may come first (read at the old position before the check): at least once.
        with contextlib.suppress(AssertionError):
            await _until(lambda: set(second()) >= set(range(25)), "the new topic's records", timeout=20)
        assert set(second()) == set(range(25)), f"the new topic's first records were skipped: {second()}"
        assert await kafka.wait_committed(own_group, topic, {0: 25}) == {0: 25}
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("new log" in message for message in warnings), warnings


# -- 8: partitions added while the stream runs -------------------------------------------------


@pytest.mark.parametrize("kafka_broker", ["noida-db"], indirect=True)  # Tansu: no CreatePartitions
async def test_a_partition_added_while_the_stream_runs_is_read_from_its_start(kafka, monkeypatch):
    """
    ``auto.offset.reset=latest``: a partition added while the stream runs must be read from its
    start, while running, and records produced to it while the stream is down are read after a
    restart (not anchored at ``latest``).
    """
    monkeypatch.setattr(cluster_watch, "CLUSTER_CHECK_INTERVAL", 0.2)
    topic = kafka.name("t")
    await kafka.create_topics(topic)
    group = kafka.name("g")
    trigger = KafkaSharedStreamTrigger(
        [topic], kafka_config_id=kafka.connection("latest", **LATEST), group_id=group
    )
    own_group = watcher_group_id(group, trigger.watcher_digest())
    async with SharedStreamHarness(confirm_after=0.0) as triggerer:
        w = triggerer.add(trigger)
        assert await kafka.wait_committed(own_group, topic, {0: 0}) == {0: 0}
        await _admin(kafka, lambda admin: admin.create_partitions({topic: NewPartitions(2)}))
        await kafka.produce(topic, [{"p": 1, "i": i} for i in range(5)], partition=1)
        await kafka.produce(topic, [{"p": 0, "i": 0}], partition=0)
        await _until(lambda: len(w.payloads) >= 6, "six records", timeout=15)
        assert sorted((p["value"]["p"], p["value"]["i"]) for p in w.payloads) == [(0, 0)] + [
            (1, i) for i in range(5)
        ], "records of the added partition were lost"
        assert await kafka.wait_committed(own_group, topic, {0: 1, 1: 5}, partitions=2) == {0: 1, 1: 5}


@pytest.mark.parametrize("kafka_broker", ["noida-db"], indirect=True)  # Tansu: no CreatePartitions
async def test_a_partition_added_while_the_stream_is_down_is_read_from_its_start_on_restart(kafka):
    topic = kafka.name("t")
    await kafka.create_topics(topic)
    group = kafka.name("g")
    trigger = KafkaSharedStreamTrigger(
        [topic], kafka_config_id=kafka.connection("latest", **LATEST), group_id=group
    )
    own_group = watcher_group_id(group, trigger.watcher_digest())
    async with SharedStreamHarness(confirm_after=0.0) as triggerer:
        triggerer.add(trigger)
        assert await kafka.wait_committed(own_group, topic, {0: 0}) == {0: 0}
    await _admin(kafka, lambda admin: admin.create_partitions({topic: NewPartitions(2)}))
    await kafka.produce(topic, [{"p": 1, "i": i} for i in range(5)], partition=1)
    async with SharedStreamHarness(confirm_after=0.0) as restarted:
        w = restarted.add(trigger)
        await kafka.produce(topic, [{"p": 0, "i": 0}], partition=0)
        await _until(lambda: any(p["value"]["p"] == 0 for p in w.payloads), "the marker")
        await kafka.wait_committed(own_group, topic, {0: 1, 1: 5}, partitions=2, timeout=5)
        assert sorted((p["value"]["p"], p["value"]["i"]) for p in w.payloads) == [(0, 0)] + [
            (1, i) for i in range(5)
        ], "records produced to the added partition while the stream was down were skipped"
