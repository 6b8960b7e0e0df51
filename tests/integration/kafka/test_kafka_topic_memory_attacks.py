"""
Attacks on issue 46's last change (commit guard, topic memory) on real brokers (FAULT_MODEL 3, 14).

The commit guard reads the topic ids once, before a round; a position whose request reaches the
coordinator after its topic was deleted and created again (a slow request, or
:meth:`.PositionStore.commit` asking again while the topic is missing and finding it live again)
lands on the new topic as if it were a position there.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from typing import Any

import pytest

from airflow_shared_stream.kafka import cluster_watch, topic_memory
from airflow_shared_stream.kafka.positions import PositionStore
from airflow_shared_stream.kafka.topic_memory import MEMORY_KEY_PREFIX, TopicMemory
from airflow_shared_stream.kafka.trigger import KafkaSharedStreamTrigger
from airflow_shared_stream.kafka.watchers import watcher_group_id
from airflow_shared_stream.testing import InMemoryStateStore, SharedStreamHarness
from tests.integration.kafka.test_kafka_cluster_changes import _until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


def second(w: Any) -> list[int]:
    """The ``i`` of each round-2 record (of the topic created again) that watcher ``w`` received."""
    return [p["value"]["i"] for p in w.payloads if p["value"]["round"] == 2]


async def _running_and_paused(kafka: Any, monkeypatch: Any) -> tuple[Any, ...]:
    """A topic and two watchers of one stream on it (and their groups), checked every 0.2 s."""
    monkeypatch.setattr(cluster_watch, "CLUSTER_CHECK_INTERVAL", 0.2)
    topic = kafka.name("t")
    await kafka.create_topics(topic)
    group = kafka.name("g")

    def watcher(name: str) -> KafkaSharedStreamTrigger:
        return KafkaSharedStreamTrigger(
            [topic], kafka_config_id=kafka.conn_id, group_id=group, match=f"'{name}' != 'never'"
        )

    running, paused = watcher("running"), watcher("paused")
    return (
        topic,
        group,
        running,
        paused,
        watcher_group_id(group, running.watcher_digest()),
        watcher_group_id(group, paused.watcher_digest()),
    )


class _HeldCommits:
    """Once :attr:`hold` is set, each commit of ``group`` waits, past the guard, for :attr:`release`."""

    def __init__(self, group: str, monkeypatch: Any) -> None:
        self.holding, self.release, self.landed = asyncio.Event(), asyncio.Event(), asyncio.Event()
        self.hold = False
        commit = PositionStore.commit

        async def slow_to_arrive(
            store: PositionStore, grp: str, offsets: Any, *args: Any, **kwargs: Any
        ) -> None:
            if self.hold and grp == group and offsets:  # past the guard: the request is on its way
                self.holding.set()
                await self.release.wait()
                await commit(store, grp, offsets, *args, **kwargs)
                self.landed.set()
                return
            await commit(store, grp, offsets, *args, **kwargs)

        monkeypatch.setattr(PositionStore, "commit", slow_to_arrive)


@pytest.mark.parametrize("kafka_broker", ["tansu"], indirect=True)  # the broker with topic ids
async def test_a_last_position_in_flight_across_a_re_creation_skips_nothing_of_the_new_topic(
    kafka, monkeypatch, caplog
):
    """
    Class 3 / 14: the gap issue 46 left ("a position already in flight during a re-creation still
    lands on the new topic"), shown to lose records. Two watchers read 20 records; one is paused
    (its trigger cancelled): its last position, 20, passes the commit guard (the ids read then are
    the old topic's) and its OffsetCommit is slow to reach the coordinator. Meanwhile the topic is
    deleted (Kafka deletes every group's positions on it) and created again with 25 records. The
    request then lands: position 20 on the new topic, which no broker tells from a real commit.
    The running watcher reads the new topic from its start (``... is a new log``). The paused
    watcher resumes: it never saw the new topic's records, so it must get 0-25. It gets 20-25: its
    stale position (its group had a position on the new log, so the stream's "away from a new log"
    rule does not apply) skips 0-19, silently. After a restart too, now that the memory keeps
    which watchers were away (``test_kafka_topic_memory_away.py``).
    """
    caplog.set_level(logging.INFO, logger="airflow_shared_stream.kafka")
    topic, group, running, paused, running_group, paused_group = await _running_and_paused(kafka, monkeypatch)
    held = _HeldCommits(paused_group, monkeypatch)
    async with SharedStreamHarness(confirm_after=0.0) as triggerer:
        a = triggerer.add(running)
        b = triggerer.add(paused)
        await kafka.produce(topic, [{"round": 1, "i": i} for i in range(20)])
        await a.wait_for_events(20)
        await b.wait_for_events(20)
        assert await kafka.wait_committed(paused_group, topic, {0: 20}) == {0: 20}
        held.hold = True
        await triggerer.remove(b)  # its last position is sent in the background: held on its way
        await asyncio.wait_for(held.holding.wait(), 20)
        await kafka.delete_topic(topic, groups=(group, running_group, paused_group))
        await kafka.create_topics(topic)
        await kafka.produce(topic, [{"round": 2, "i": i} for i in range(25)])
        held.release.set()
        await asyncio.wait_for(held.landed.wait(), 30)

        await _until(
            lambda: set(second(a)) >= set(range(25)), "the running watcher's new records", timeout=30
        )
        resumed = triggerer.add(paused)
        await kafka.produce(topic, [{"round": 2, "i": 25}])
        with contextlib.suppress(AssertionError):
            await _until(lambda: set(second(resumed)) >= set(range(26)), "0-25", timeout=20)
        assert set(second(resumed)) >= set(range(26)), f"the paused watcher skipped: {second(resumed)}"


def _remembered_ids(store: InMemoryStateStore) -> set[str]:
    """Every topic id the stream's memory in ``store`` names."""
    return {
        topic_id
        for key, value in store.values.items()
        if key.startswith(MEMORY_KEY_PREFIX)
        for topic_id in json.loads(value)["topics"].values()
    }


class _WritesFailing(InMemoryStateStore):
    """A state store whose writes of the stream's memory fail while ``failing`` (an API server away)."""

    def __init__(self) -> None:
        super().__init__()
        self.failing = False
        self.failed = 0

    def set(self, key: str, value: Any) -> None:
        if self.failing and key.startswith(MEMORY_KEY_PREFIX):
            self.failed += 1
            raise RuntimeError("the state store is not reachable")
        super().set(key, value)


@pytest.mark.parametrize("kafka_broker", ["tansu"], indirect=True)  # the broker with topic ids
async def test_a_failed_memory_write_does_not_make_a_restart_re_read_a_followed_topic(kafka, monkeypatch):
    """
    Class 11 / 13 / 3: "the same id" must never be taken for a new log. A running stream follows
    a re-creation (reads the new topic from its start) while the asset state store's writes fail
    for a moment, so the memory's write of the new id fails (logged at INFO). The store comes back
    at once and the stream runs on, committing positions on the new topic (here 10 records; in
    production, days of them). The write is never asked again: the memory is woken only when a
    commit names an id it has not noted, and it noted the new one before the write failed. The
    triggerer is then killed (its memory task ends without its close: no last flush). The restart
    reads the old id, finds the new one, and takes the topic, which it read and committed on for
    days, for created again while no stream ran: it re-reads every retained record for every
    watcher, firing their Dags again. Expected: the restart reads on from the positions (record
    10 only).
    """
    monkeypatch.setattr(cluster_watch, "CLUSTER_CHECK_INTERVAL", 0.2)
    monkeypatch.setattr(topic_memory, "WRITE_RETRY", 0.2)
    topic = kafka.name("t")
    await kafka.create_topics(topic)
    group = kafka.name("g")
    trigger = KafkaSharedStreamTrigger([topic], kafka_config_id=kafka.conn_id, group_id=group)
    own_group = watcher_group_id(group, trigger.watcher_digest())
    store = _WritesFailing()
    closes = TopicMemory.aclose

    async def killed(memory: TopicMemory) -> None:  # SIGKILL: the process ends, nothing flushed
        task, memory._task = memory._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(BaseException):
                await task

    async with SharedStreamHarness(confirm_after=0.0, state_store=store) as triggerer:
        w = triggerer.add(trigger)
        await kafka.produce(topic, [{"round": 1, "i": i} for i in range(5)])
        await w.wait_for_events(5)
        await _until(lambda: bool(_remembered_ids(store)), "the stream's memory of its topic ids")
        old_ids = _remembered_ids(store)
        store.failing = True
        await kafka.delete_topic(topic, groups=(group, own_group))
        await kafka.create_topics(topic)
        await kafka.produce(topic, [{"round": 2, "i": i} for i in range(5)])
        await _until(lambda: set(second(w)) >= set(range(5)), "the new topic's records, from its start")
        await _until(lambda: store.failed > 0, "a failed write of the memory")
        store.failing = False  # the store is back; the stream runs on
        await kafka.produce(topic, [{"round": 2, "i": i} for i in range(5, 10)])
        await _until(lambda: set(second(w)) >= set(range(10)), "records 5-9")
        assert await kafka.wait_committed(own_group, topic, {0: 10}) == {0: 10}
        with contextlib.suppress(AssertionError):  # the failed write asked again (never, it was)
            await _until(lambda: _remembered_ids(store) != old_ids, "the new id written", timeout=5)
        monkeypatch.setattr(TopicMemory, "aclose", killed)
    monkeypatch.setattr(TopicMemory, "aclose", closes)
    async with SharedStreamHarness(confirm_after=0.0, state_store=store) as restarted:
        again = restarted.add(trigger)
        await kafka.produce(topic, [{"round": 2, "i": 10}])
        await _until(lambda: 10 in second(again), "record 10")
        await asyncio.sleep(0)
        assert second(again) == [10], f"the restart read the followed topic again: {second(again)}"


class _ReadsFailing(InMemoryStateStore):
    """A state store whose reads of the stream's memory fail while ``failing`` (a supervisor too slow)."""

    def __init__(self) -> None:
        super().__init__()
        self.failing = False
        self.failed = 0

    def get(self, key: str, default: Any = None) -> Any:
        if self.failing and key.startswith(MEMORY_KEY_PREFIX):
            self.failed += 1
            raise TimeoutError("the supervisor did not answer")
        return super().get(key, default)


@pytest.mark.parametrize("kafka_broker", ["tansu"], indirect=True)  # the broker with topic ids
async def test_a_failed_memory_read_does_not_make_the_next_start_re_read_a_followed_topic(kafka, monkeypatch):
    """
    Class 11 / 13: the stream's memory holds the topic's id. A start's read of it fails (the
    triggerer's supervisor slow past the bound, say; logged at WARNING): that run wrote nothing
    (it never read the memory: a re-creation while no stream ran stays visible to the next start);
    now the read is asked again, and a late answer leaves alone a topic this run followed. During that run
    the topic is deleted and created again, and the stream follows it (reads the new topic from its
    start, for every watcher) and runs on, committing on the new topic (10 records here; days in
    production). Both stops are graceful. The next start reads the old id, finds the new one, and
    takes the topic it read and committed on for days for created again while no stream ran: it
    reads it all again, firing every watcher's Dag again for every record. Expected: record 11
    only.
    """
    monkeypatch.setattr(cluster_watch, "CLUSTER_CHECK_INTERVAL", 0.2)
    monkeypatch.setattr(topic_memory, "READ_RETRY", 0.2, raising=False)
    topic = kafka.name("t")
    await kafka.create_topics(topic)
    group = kafka.name("g")
    trigger = KafkaSharedStreamTrigger([topic], kafka_config_id=kafka.conn_id, group_id=group)
    own_group = watcher_group_id(group, trigger.watcher_digest())
    store = _ReadsFailing()

    async with SharedStreamHarness(confirm_after=0.0, state_store=store) as first:
        w = first.add(trigger)
        await kafka.produce(topic, [{"round": 1, "i": i} for i in range(5)])
        await w.wait_for_events(5)
        await _until(lambda: bool(_remembered_ids(store)), "the stream's memory of its topic ids")
    store.failing = True
    async with SharedStreamHarness(confirm_after=0.0, state_store=store) as second_run:
        w = second_run.add(trigger)
        await _until(lambda: store.failed > 0, "a failed read of the memory")
        old_ids = _remembered_ids(store)
        await kafka.produce(topic, [{"round": 1, "i": 5}])
        await _until(lambda: any(p["value"]["i"] == 5 for p in w.payloads), "the stream reading")
        await kafka.delete_topic(topic, groups=(group, own_group))
        await kafka.create_topics(topic)
        await kafka.produce(topic, [{"round": 2, "i": i} for i in range(10)])
        await _until(lambda: set(second(w)) >= set(range(10)), "the new topic's records, from its start")
        assert await kafka.wait_committed(own_group, topic, {0: 10}) == {0: 10}
        before = second(w)
        store.failing = False  # answered only now, after the re-creation this run followed
        with contextlib.suppress(AssertionError):
            await _until(lambda: _remembered_ids(store) != old_ids, "the new id written", timeout=5)
        await kafka.produce(topic, [{"round": 2, "i": 10}])
        await _until(lambda: 10 in second(w), "record 10")
        assert second(w) == [*before, 10], f"the late read re-read the followed topic: {second(w)}"
        assert await kafka.wait_committed(own_group, topic, {0: 11}) == {0: 11}
    async with SharedStreamHarness(confirm_after=0.0, state_store=store) as third:
        again = third.add(trigger)
        await kafka.produce(topic, [{"round": 2, "i": 11}])
        await _until(lambda: 11 in second(again), "record 11")
        assert set(second(again)) <= {10, 11}, f"the restart read the followed topic again: {second(again)}"


@pytest.mark.parametrize("kafka_broker", ["tansu"], indirect=True)  # the broker with topic ids
async def test_a_topic_created_again_while_no_stream_runs_is_read_from_its_start_by_a_later_watcher(
    kafka, monkeypatch
):
    """
    Class 10 / 3: the memory lives in each watcher's asset (one state store per asset in Airflow;
    the harness shares one, so each watcher is given its own here). It is written when the stream
    first commits on a topic id, into the assets of the watchers running then. Watcher 1 runs the
    stream first (its asset remembers the id); watcher 2 joins later, runs for a while, and then
    watcher 1 is paused: watcher 2's asset never got the memory (the ids did not change). The
    triggerer stops; the topic is deleted and created again and given 5 records while no stream
    runs. Watcher 2 starts alone (``auto.offset.reset=latest``): its asset holds no memory, so the
    re-creation was not seen and record 0 was skipped (Tansu's wrong end offset replays the rest),
    silently, as before issue 46. (The memory also keeps the watchers it served, written to every
    watcher's asset when one is first admitted: here that write fails on watcher 2's asset, so
    only the giving below puts it there.) Now a watcher that joins is given the memory (within
    ``WRITE_RETRY``): watcher 2 gets the new topic's records 0-5.
    """
    monkeypatch.setattr(topic_memory, "WRITE_RETRY", 0.2)
    topic = kafka.name("t")
    await kafka.create_topics(topic)
    group = kafka.name("g")
    conn = kafka.connection("latest", **{"auto.offset.reset": "latest"})

    def watcher(name: str) -> KafkaSharedStreamTrigger:
        return KafkaSharedStreamTrigger(
            [topic], kafka_config_id=conn, group_id=group, match=f"'{name}' != 'x'"
        )

    first, later = watcher("first"), watcher("later")
    first_group = watcher_group_id(group, first.watcher_digest())
    later_group = watcher_group_id(group, later.watcher_digest())
    first_asset, later_asset = InMemoryStateStore(), _WritesFailing()
    later_asset.failing = True  # the write when watcher 2 is first admitted fails there

    async with SharedStreamHarness(confirm_after=0.0, state_store=InMemoryStateStore()) as triggerer:
        a = triggerer.add(first)
        a.trigger.asset_state_store = first_asset  # one store per asset, as Airflow gives
        assert await kafka.wait_committed(first_group, topic, {0: 0}) == {0: 0}
        await kafka.produce(topic, [{"round": 1, "i": i} for i in range(5)])
        await a.wait_for_events(5)
        await _until(lambda: bool(_remembered_ids(first_asset)), "the stream's memory of its topic ids")
        b = triggerer.add(later)
        b.trigger.asset_state_store = later_asset
        assert await kafka.wait_committed(later_group, topic, {0: 5}) == {0: 5}
        await _until(lambda: later_asset.failed > 0, "a failed write of the memory to watcher 2's asset")
        later_asset.failing = False
        await kafka.produce(topic, [{"round": 1, "i": 5}])
        await b.wait_for_events(1)
        assert await kafka.wait_committed(later_group, topic, {0: 6}) == {0: 6}
        with contextlib.suppress(AssertionError):  # given to it while it runs (never, it was)
            await _until(lambda: bool(_remembered_ids(later_asset)), "watcher 2's memory", timeout=5)
        await triggerer.remove(a)  # watcher 1's Dag paused
        await kafka.produce(topic, [{"round": 1, "i": 6}])
        await b.wait_for_events(2)
        assert await kafka.wait_committed(later_group, topic, {0: 7}) == {0: 7}
    await kafka.delete_topic(topic, groups=(group, first_group, later_group))
    await kafka.create_topics(topic)
    await kafka.produce(topic, [{"round": 2, "i": i} for i in range(5)])
    async with SharedStreamHarness(confirm_after=0.0, state_store=InMemoryStateStore()) as restarted:
        again = restarted.add(later)
        again.trigger.asset_state_store = later_asset
        for _ in range(200):  # placed (its start committed) before the marker
            if (await kafka.committed(later_group, topic)).get(0) is not None:
                break
            await asyncio.sleep(0.1)
        await kafka.produce(topic, [{"round": 2, "i": 5}])
        await _until(lambda: 5 in second(again), "record 5")
        assert set(second(again)) >= set(range(6)), f"the new topic's records were skipped: {second(again)}"
