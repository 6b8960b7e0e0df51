"""
Attacks on the re-creation fix (issue 46) and its dropped commits, on real brokers (FAULT_MODEL
classes 3, 7, 10, 11, 14).
"""

from __future__ import annotations

import contextlib
import logging
from collections import defaultdict
from types import SimpleNamespace
from typing import Any

import pytest
from aiokafka.admin import NewPartitions
from aiokafka.protocol.commit import OffsetCommitRequest

from airflow_shared_stream.kafka import cluster_watch
from airflow_shared_stream.kafka.commit_guard import CommitGuard
from airflow_shared_stream.kafka.positions import PositionStore
from airflow_shared_stream.kafka.trigger import KafkaSharedStreamTrigger
from airflow_shared_stream.kafka.watchers import watcher_group_id
from airflow_shared_stream.testing import SharedStreamHarness
from tests.integration.kafka.test_kafka_cluster_changes import _admin, _until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


def _round(handle, n: int) -> list[int]:
    return [p["value"]["i"] for p in handle.payloads if p["value"].get("round") == n]


WITHHELD = "(withheld before the request)"


def _count_refused_commits(monkeypatch: pytest.MonkeyPatch, topic: str) -> dict[str, int]:
    """
    Per group, how many OffsetCommit answers refused ``topic`` (``UNKNOWN_TOPIC_OR_PARTITION``);
    under :data:`WITHHELD`, how many commit rounds had ``topic``'s targets withheld because its
    topic id was missing (:mod:`.commit_guard`, on a broker with ids), never sent at all.
    """
    counts: dict[str, int] = defaultdict(int)
    commit_once = PositionStore._commit_once
    admit = CommitGuard.admit

    async def admitting(guard: CommitGuard, offsets: Any) -> Any:
        passed = await admit(guard, offsets)
        if any(tp.topic == topic for tp in offsets) and not any(tp.topic == topic for tp in passed):
            counts[WITHHELD] += 1
        return passed

    monkeypatch.setattr(CommitGuard, "admit", admitting)

    async def counting(store: PositionStore, group: str, offsets: Any, *args: Any, **kwargs: Any) -> Any:
        refused = await commit_once(store, group, offsets, *args, **kwargs)  # metadata, member, retention
        if any(tp.topic == topic for tp in refused):
            counts[group] += 1
        return refused

    monkeypatch.setattr(PositionStore, "_commit_once", counting)
    return counts


@pytest.mark.parametrize("kafka_broker", ["tansu"], indirect=True)
async def test_a_topic_deleted_for_good_does_not_stall_the_streams_commits_of_its_other_topic(
    kafka, monkeypatch, caplog
):
    """
    Class 14 / 7: one stream reads two topics; one of them is deleted for good. The stream's
    own position refresh queues that topic's lane again, and its commit is refused
    ``UNKNOWN_TOPIC_OR_PARTITION``. The other topic's records go on firing, and the stream's
    commit of them must go on too (a restart re-fires only what is not committed).

    Broke: the stream commits through ``AIOKafkaConsumer.commit``, which takes
    ``UNKNOWN_TOPIC_OR_PARTITION`` for retriable and asks again every 100 ms for ever (an ERROR
    line each time). The committer's round never ends, so the kept ACKs are never folded: the
    watcher's own position and the stream's commit stay at 3 while the kept topic's records fire
    (every restart re-fires all of them, for as long as the stream runs). Kafka answers that code
    for a topic it does not have (``KafkaApis.handleOffsetCommitRequest``); Tansu does too.
    Tansu only: noida-db creates the deleted topic again on the stream's next metadata request
    (auto-creation), so a topic is never gone for good there. On Tansu (topic ids) the commit
    round reads the ids first and withholds the gone topic's lane before any request
    (:mod:`.commit_guard`); either way the lane comes up in several rounds and must stall nothing.
    """
    from airflow_shared_stream.kafka import producer as producer_module

    caplog.set_level(logging.INFO)
    monkeypatch.setattr(cluster_watch, "CLUSTER_CHECK_INTERVAL", 0.2)
    monkeypatch.setattr(producer_module, "POSITION_REFRESH_INTERVAL", 0.2)
    kept, dropped, group = kafka.name("kept"), kafka.name("dropped"), kafka.name("g")
    refused_rounds = _count_refused_commits(monkeypatch, dropped)
    await kafka.create_topics(kept, dropped)
    trigger = KafkaSharedStreamTrigger([kept, dropped], kafka_config_id=kafka.conn_id, group_id=group)
    own_group = watcher_group_id(group, trigger.watcher_digest())
    async with SharedStreamHarness(confirm_after=0.0) as triggerer:
        w = triggerer.add(trigger)
        assert await kafka.wait_committed(own_group, kept, {0: 0}) == {0: 0}
        await kafka.produce(kept, [{"round": 1, "i": i} for i in range(3)])
        await kafka.produce(dropped, [{"round": 1, "i": i} for i in range(3)])
        await w.wait_for_events(6)
        assert await kafka.wait_committed(group, kept, {0: 3}) == {0: 3}
        await kafka.delete_topic(dropped, groups=())
        # Let several refreshes of the gone topic's lane come and go: each commit of it refused.
        # Counted at the request, not in the log: Airflow's logging, once another test in this
        # process configured it, may hide the INFO lines that say so.
        await _until(
            lambda: refused_rounds[group] + refused_rounds[WITHHELD] >= 3,
            "commits refused for the gone topic",
            timeout=100.0,  # a guard, not a wait: under load the refreshes come late
        )
        await kafka.produce(kept, [{"round": 2, "i": i} for i in range(4)])
        with contextlib.suppress(AssertionError):
            await _until(lambda: set(_round(w, 2)) >= set(range(4)), "round 2 of the kept topic")
        assert set(_round(w, 2)) == set(range(4)), _round(w, 2)
        assert await kafka.wait_committed(own_group, kept, {0: 7}) == {0: 7}
        assert await kafka.wait_committed(group, kept, {0: 7}) == {0: 7}, "the stream's commit stalled"
        assert w.error is None, w.error
    assert any(
        r.levelno == logging.WARNING and dropped in r.getMessage() and "is gone" in r.getMessage()
        for r in caplog.records
    ), "the gone topic was not named at WARNING"
    spins = [
        r
        for r in caplog.records
        if r.levelno >= logging.ERROR and "UnknownTopicOrPartition" in r.getMessage()
    ]
    assert len(spins) < 5, f"{len(spins)} ERROR lines for one gone topic: {spins[-1].getMessage()}"


class _LaggingCoordinator:
    """
    A group coordinator whose metadata does not have a partition yet: its OffsetCommit answer is
    ``UNKNOWN_TOPIC_OR_PARTITION`` for that partition (Kafka's ``handleOffsetCommitRequest``
    refuses any partition its ``metadataCache`` lacks, and a broker learns of partitions added
    some time after the controller). The others of the request are committed. After
    :meth:`die`, nothing is committed any more: the triggerer was killed (SIGKILL sends nothing).
    """

    def __init__(self, monkeypatch: pytest.MonkeyPatch, topic: str, partition: int) -> None:
        self.lane = (topic, partition)
        self.lagging = False
        self.dead = False
        self.refused: list[str] = []
        send = PositionStore._send
        coordinator = self

        async def lagging_send(store: PositionStore, group: str, request: Any) -> Any:
            if not isinstance(request, OffsetCommitRequest):
                return await send(store, group, request)
            if coordinator.dead:
                return SimpleNamespace(topics=[])
            if not coordinator.lagging:
                return await send(store, group, request)
            kept, answer = [], []
            for topic, parts in request._topics:
                rest = [p for p in parts if (topic, p[0]) != coordinator.lane]
                if len(rest) < len(parts):
                    answer.append((topic, [(coordinator.lane[1], 3)]))  # UNKNOWN_TOPIC_OR_PARTITION
                    coordinator.refused.append(group)
                if rest:
                    kept.append((topic, rest))
            if kept:
                real = await send(
                    store,
                    group,
                    OffsetCommitRequest(
                        request._consumer_group,
                        request._consumer_group_generation_id,
                        request._consumer_id,
                        request._retention_time,
                        kept,
                    ),
                )
                answer.extend(real.topics)
            return SimpleNamespace(topics=answer)

        monkeypatch.setattr(PositionStore, "_send", lagging_send)


@pytest.mark.parametrize("kafka_broker", ["noida-db"], indirect=True)  # Tansu 0.6.0: no CreatePartitions
async def test_a_new_partitions_start_refused_by_a_lagging_coordinator_is_not_lost_to_a_kill(
    kafka, monkeypatch, caplog
):
    """
    Classes 3, 10, 14: a partition is added under a running stream of two watchers. The stream
    commits the new partition's start 0 for each watcher, and the coordinator, whose metadata
    lags, refuses it ``UNKNOWN_TOPIC_OR_PARTITION`` (the topic is live), and has the partition
    soon after; B's position moves on partition 0. The triggerer is then killed, before the
    minutely refresh (played in-process: from then on nothing is committed). Another triggerer
    runs the stream for watcher A alone (B's Dag is paused meanwhile) and reads partition 1's
    records 0-2; then B comes back. B had
    a position on partition 1 (0, refused); it must read 0-2 (at-least-once: re-fire, never skip).
    Broke: the refusal was dropped as if the topic were deleted, B had no position on partition 1
    after the kill, and was anchored at the read position 3: records 0-2 never fired for B.
    The refusal of a live partition is now asked again until the coordinator has it.
    """
    caplog.set_level(logging.INFO)
    monkeypatch.setattr(cluster_watch, "CLUSTER_CHECK_INTERVAL", 0.2)
    topic, group = kafka.name("t"), kafka.name("g")
    await kafka.create_topics(topic)
    coordinator = _LaggingCoordinator(monkeypatch, topic, 1)

    def watcher(name: str) -> KafkaSharedStreamTrigger:
        return KafkaSharedStreamTrigger(
            [topic], kafka_config_id=kafka.conn_id, group_id=group, match=f"'{name}' != 'never'"
        )

    a, b = watcher("a"), watcher("b")
    group_b = watcher_group_id(group, b.watcher_digest())
    async with SharedStreamHarness(confirm_after=0.0) as triggerer:
        wa, wb = triggerer.add(a), triggerer.add(b)
        await kafka.produce(topic, [{"round": 1, "i": i} for i in range(2)], partition=0)
        await wa.wait_for_events(2)
        await wb.wait_for_events(2)
        assert await kafka.wait_committed(group_b, topic, {0: 2}) == {0: 2}
        coordinator.lagging = True
        await _admin(kafka, lambda admin: admin.create_partitions({topic: NewPartitions(2)}))
        await _until(lambda: group_b in coordinator.refused, "the refused start of partition 1")
        coordinator.lagging = False  # the coordinator has the partition now
        await kafka.produce(topic, [{"round": 1, "i": 2}], partition=0)
        await wb.wait_for_events(3)
        assert await kafka.wait_committed(group_b, topic, {0: 3}) == {0: 3}  # B's commits go on
        coordinator.dead = True  # SIGKILL, before the minutely refresh: nothing more is sent
    coordinator.lagging = coordinator.dead = False
    async with SharedStreamHarness(confirm_after=0.0) as triggerer:
        wa = triggerer.add(a)
        await kafka.produce(topic, [{"round": 2, "i": i} for i in range(3)], partition=1)
        with contextlib.suppress(AssertionError):
            await _until(lambda: set(_round(wa, 2)) >= set(range(3)), "A reading partition 1")
        assert set(_round(wa, 2)) == set(range(3)), _round(wa, 2)
        assert await kafka.wait_committed(group, topic, {0: 3, 1: 3}, partitions=2) == {0: 3, 1: 3}
        wb = triggerer.add(b)
        await kafka.produce(topic, [{"round": 2, "i": 3}], partition=1)
        with contextlib.suppress(AssertionError):
            await _until(lambda: set(_round(wb, 2)) >= set(range(4)), "B reading partition 1")
        assert set(_round(wb, 2)) >= set(range(4)), f"B skipped records of partition 1: {_round(wb, 2)}"


@pytest.mark.parametrize("kafka_broker", ["tansu", "noida-db"], indirect=True)
async def test_a_topic_created_again_with_fewer_partitions_is_read_from_its_start(kafka, monkeypatch, caplog):
    """
    Class 14: a topic of two partitions is deleted and created again with one, under a running
    stream, and records are produced to the new topic at once. The stream must read the new
    log from its start (its lane 1 is gone), and keep running.

    Broke on noida-db (a broker without topic ids, like Kafka before 2.8): the check that finds a
    new log by its end asks the end of every lane, the gone partition 1 too; that request times
    out (``Checking the partitions of ... failed (KafkaTimeoutError)``, INFO) at every check, so
    the new log is never seen, and the client's own "offset out of range" reset moved partition
    0 past the new log's records 0-1: skipped, silently (seen: ``[2]``, waited 90 s).
    Tansu (topic ids) passes. A topic with fewer partitions than the stream reads is now taken
    for created again, and its lanes that are gone are dropped from the stream.
    """
    caplog.set_level(logging.INFO)
    monkeypatch.setattr(cluster_watch, "CLUSTER_CHECK_INTERVAL", 0.2)
    topic, group = kafka.name("t"), kafka.name("g")
    await kafka.create_topics(topic, partitions=2)
    trigger = KafkaSharedStreamTrigger([topic], kafka_config_id=kafka.conn_id, group_id=group)
    own_group = watcher_group_id(group, trigger.watcher_digest())
    async with SharedStreamHarness(confirm_after=0.0) as triggerer:
        w = triggerer.add(trigger)
        assert await kafka.wait_committed(own_group, topic, {0: 0, 1: 0}, partitions=2) == {0: 0, 1: 0}
        for partition in (0, 1):
            await kafka.produce(topic, [{"round": 1, "i": i} for i in range(2)], partition=partition)
        await w.wait_for_events(4)
        await kafka.delete_topic(topic, groups=(group, own_group))
        await kafka.create_topics(topic, partitions=1)
        await kafka.produce(topic, [{"round": 2, "i": i} for i in range(3)], partition=0)
        with contextlib.suppress(AssertionError):
            await _until(lambda: set(_round(w, 2)) >= set(range(3)) or w.error is not None, "the new log")
        assert w.error is None, w.error
        assert set(_round(w, 2)) == set(range(3)), f"the new log's records were skipped: {_round(w, 2)}"


@pytest.mark.parametrize("kafka_broker", ["noida-db"], indirect=True)  # Tansu: no DeleteRecords
async def test_retention_on_a_topic_just_created_again_is_said_and_the_rest_read(kafka, monkeypatch, caplog):
    """
    Class 14: the topic (read up to 10) is deleted and created again, filled with 6 records,
    and retention deletes the new log's first 2 (DeleteRecords) before the stream saw any of it.
    The stream must read 2-5 (what is left of the new log) and keep running; 0-1 are lost to
    retention, which at-least-once does not cover, but nothing still in the log is skipped.
    """
    from aiokafka import TopicPartition
    from aiokafka.admin import RecordsToDelete

    caplog.set_level(logging.INFO)
    monkeypatch.setattr(cluster_watch, "CLUSTER_CHECK_INTERVAL", 0.2)
    topic, group = kafka.name("t"), kafka.name("g")
    await kafka.create_topics(topic)
    trigger = KafkaSharedStreamTrigger([topic], kafka_config_id=kafka.conn_id, group_id=group)
    own_group = watcher_group_id(group, trigger.watcher_digest())
    async with SharedStreamHarness(confirm_after=0.0) as triggerer:
        w = triggerer.add(trigger)
        await kafka.produce(topic, [{"round": 1, "i": i} for i in range(10)])
        await w.wait_for_events(10)
        await kafka.delete_topic(topic, groups=(group, own_group))
        await kafka.create_topics(topic)
        await kafka.produce(topic, [{"round": 2, "i": i} for i in range(6)])
        tp = TopicPartition(topic, 0)
        await _admin(kafka, lambda admin: admin.delete_records({tp: RecordsToDelete(2)}))
        with contextlib.suppress(AssertionError):
            await _until(lambda: set(_round(w, 2)) >= set(range(2, 6)) or w.error is not None, "the new log")
        assert w.error is None, w.error
        assert set(_round(w, 2)) >= set(range(2, 6)), (
            f"records still in the new log were skipped: {_round(w, 2)}"
        )
        await kafka.produce(topic, [{"round": 2, "i": 6}])
        await _until(lambda: 6 in _round(w, 2), "the next record")
