"""
Attacks on issue 46's coordinator handling at commits (FAULT_MODEL classes 10 and 14).

Kafka answers an ``OffsetCommit`` to a broker that is no longer the group's coordinator (a
broker restart, a rolling upgrade, a partition of ``__consumer_offsets`` moved) with
``NOT_COORDINATOR`` for every partition, and while the new coordinator loads the group with
``COORDINATOR_LOAD_IN_PROGRESS`` (``GroupCoordinator.handleCommitOffsets``): retriable, the
commit not applied. Neither broker here ever moves a coordinator (FIDELITY.md), so
:class:`~tests.support.kafka_proxy.KafkaProtocolProxy` answers so for chosen groups.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import pytest

from airflow_shared_stream.kafka import cluster_watch
from airflow_shared_stream.kafka.commit_guard import CommitGuard
from airflow_shared_stream.kafka.committer import OffsetCommitter
from airflow_shared_stream.kafka.trigger import KafkaSharedStreamTrigger
from airflow_shared_stream.kafka.watchers import watcher_group_id
from airflow_shared_stream.testing import SharedStreamHarness
from tests.integration.kafka.test_kafka_cluster_changes import _until
from tests.support.kafka_proxy import KafkaProtocolProxy

pytestmark = [pytest.mark.integration, pytest.mark.timeout(150)]

POSITIONS_LOG = "airflow_shared_stream.kafka"


def _round(handle: Any, n: int) -> list[int]:
    return [p["value"]["i"] for p in handle.payloads if p["value"].get("round") == n]


@dataclass
class _Scene:
    """Two watchers of one stream through a proxy; the paused one was away across a re-creation."""

    kafka: Any
    proxy: KafkaProtocolProxy
    triggerer: SharedStreamHarness
    topic: str
    running: KafkaSharedStreamTrigger
    paused: KafkaSharedStreamTrigger
    running_group: str
    a: Any
    """The running watcher's handle (replaced when Airflow starts its failed trigger again)."""


@contextlib.asynccontextmanager
async def _paused_across_a_re_creation(kafka: Any, monkeypatch: Any) -> AsyncIterator[_Scene]:
    """
    Two watchers read 10 records; one is paused (its last position sent). The topic is deleted
    (with every group's offsets, as Kafka does) and created again with 15 records, which the
    running watcher reads and commits: the stream knows the paused one was away from the new log.
    """
    monkeypatch.setattr(cluster_watch, "CLUSTER_CHECK_INTERVAL", 0.2)
    last_sent = asyncio.Event()
    stop = OffsetCommitter.stop

    async def stop_and_note(committer: OffsetCommitter, *args: Any, **kwargs: Any) -> None:
        await stop(committer, *args, **kwargs)
        last_sent.set()

    monkeypatch.setattr(OffsetCommitter, "stop", stop_and_note)
    topic, group = kafka.name("t"), kafka.name("g")
    await kafka.create_topics(topic)
    async with KafkaProtocolProxy(kafka.broker.port) as proxy:
        settings = {"bootstrap.servers": proxy.bootstrap, "auto.offset.reset": "earliest"}
        conn_id = kafka.connection("proxy", **settings)

        def watcher(name: str) -> KafkaSharedStreamTrigger:
            return KafkaSharedStreamTrigger(
                [topic], kafka_config_id=conn_id, group_id=group, match=f"'{name}' != 'never'"
            )

        running, paused = watcher("running"), watcher("paused")
        running_group = watcher_group_id(group, running.watcher_digest())
        paused_group = watcher_group_id(group, paused.watcher_digest())
        async with SharedStreamHarness(confirm_after=0.0) as triggerer:
            a = triggerer.add(running)
            b = triggerer.add(paused)
            assert await kafka.wait_committed(paused_group, topic, {0: 0}) == {0: 0}
            await kafka.produce(topic, [{"round": 1, "i": i} for i in range(10)])
            await a.wait_for_events(10)
            await b.wait_for_events(10)
            assert await kafka.wait_committed(paused_group, topic, {0: 10}) == {0: 10}
            await triggerer.remove(b)
            await asyncio.wait_for(last_sent.wait(), 20)
            await kafka.delete_topic(topic, groups=(group, running_group, paused_group))
            await kafka.create_topics(topic)
            await kafka.produce(topic, [{"round": 2, "i": i} for i in range(15)])
            await _until(lambda: set(_round(a, 2)) >= set(range(15)), "the running watcher's new log")
            assert await kafka.wait_committed(running_group, topic, {0: 15}) == {0: 15}
            yield _Scene(kafka, proxy, triggerer, topic, running, paused, running_group, a)


async def _the_paused_watcher_resumes(scene: _Scene, fault: str) -> None:
    """
    Once records 15 and 16 went through the fault: the running watcher's commit of 17 lands or the
    stream fails (then started again, as Airflow does); the paused watcher resumes and must get
    the whole new log, 0-17, and the stream must not have failed.
    """
    kafka, topic = scene.kafka, scene.topic
    for _ in range(150):  # the watcher's next commit lands, or the stream fails
        if scene.a.error is not None or (await kafka.committed(scene.running_group, topic)).get(0) == 17:
            break
        await asyncio.sleep(0.2)
    stream_failed = scene.a.error
    if stream_failed is not None:  # Airflow's triggerer starts a failed trigger again
        scene.a = scene.triggerer.add(scene.running)
    resumed = scene.triggerer.add(scene.paused)
    await kafka.produce(topic, [{"round": 2, "i": 17}])
    with contextlib.suppress(AssertionError):
        await _until(lambda: set(_round(resumed, 2)) >= set(range(18)), "0-17 of the new log")
    got = sorted(set(_round(resumed, 2)))
    assert stream_failed is None, f"{fault} failed the stream: {stream_failed!r}; got {got}"
    assert got == list(range(18)), f"the paused watcher skipped the new log: {got}"


@pytest.mark.parametrize("kafka_broker", ["tansu", "noida-db"], indirect=True)
async def test_a_coordinator_move_at_a_watchers_commit_neither_fails_the_stream_nor_loses_a_new_log(
    kafka, monkeypatch, caplog
):
    """
    Class 14 / 10. Two watchers read 10 records; one is paused. The topic is deleted (with every
    group's offsets, as Kafka does) and created again with 15 records; the running watcher reads
    them, and the stream remembers that the paused one was away from the new log. Then the
    running watcher's group coordinator moves: its next position commit is answered
    ``NOT_COORDINATOR``. The stream's own commits ask such an answer again; a watcher's went
    straight to the stream's error: every watcher of the stream failed, and the stream Airflow
    started again for them no longer knew the paused watcher was away, so on resuming it skipped
    the new log's records (docs/kafka.rst: "the stream lives through the gap, and with it its
    memory of the watchers away from the new topic"). A move must be asked again, like the
    stream's own commits and every position read.
    """
    caplog.set_level(logging.INFO, logger=POSITIONS_LOG)
    async with _paused_across_a_re_creation(kafka, monkeypatch) as scene:
        proxy, topic = scene.proxy, scene.topic
        proxy.moved[scene.running_group] = 1  # its coordinator moves before its next commit
        await kafka.produce(topic, [{"round": 2, "i": 15}])
        await _until(lambda: proxy.moved_answered == 1, "the commit the old coordinator refused")
        await kafka.produce(topic, [{"round": 2, "i": 16}])
        await _the_paused_watcher_resumes(scene, "a move")
        assert await kafka.wait_committed(scene.running_group, topic, {0: 18}) == {0: 18}


@pytest.mark.parametrize("kafka_broker", ["tansu"], indirect=True)  # the commit guard needs topic ids
async def test_a_broker_restart_at_a_commit_round_neither_fails_the_stream_nor_loses_a_new_log(
    kafka, monkeypatch, caplog
):
    """
    Class 3 / 14: a broker restart mid-commit. As above, one watcher is paused across a
    re-creation the stream followed. Then the broker goes away (every connection closed, new
    ones refused, as in a restart) just as a commit round starts, for longer than the commit
    guard's five reads of the topic ids (about 3 s) and well within what a commit itself asks
    again (about 15 s). The guard's last failed read failed the round, so the stream, and with it
    its memory of the watchers away from the new log: the round's committer stopped (ERROR
    ``committing offsets failed ... NodeNotReadyError``), the next record failed the stream, and
    the paused watcher, resumed into the stream Airflow started again, skipped the new log.
    """
    caplog.set_level(logging.INFO, logger=POSITIONS_LOG)
    armed, at_round, outage = False, asyncio.Event(), asyncio.Event()
    guards: list[CommitGuard] = []
    admit = CommitGuard.admit

    async def admit_after_the_outage_began(guard: CommitGuard, offsets: Any) -> Any:
        nonlocal armed
        if armed and offsets:
            armed = False
            guards.append(guard)
            at_round.set()
            await outage.wait()
        return await admit(guard, offsets)

    monkeypatch.setattr(CommitGuard, "admit", admit_after_the_outage_began)
    async with _paused_across_a_re_creation(kafka, monkeypatch) as scene:
        proxy, topic = scene.proxy, scene.topic
        armed = True
        await kafka.produce(topic, [{"round": 2, "i": 15}])
        await asyncio.wait_for(at_round.wait(), 30)
        proxy.go_down()
        reads = guards[0].reads
        outage.set()
        # Down until the guard has read (and failed) five times more, or the stream failed.
        await _until(lambda: guards[0].reads >= reads + 5 or scene.a.error is not None, "the guard's reads")
        await asyncio.sleep(1.0)  # its fifth read's answer (a refused connection) comes back
        proxy.come_up()
        await kafka.produce(topic, [{"round": 2, "i": 16}])  # the next round, after the outage
        await _the_paused_watcher_resumes(scene, "an outage")
