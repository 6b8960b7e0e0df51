"""
The stream's memory of the watchers away from a new log, across triggerer restarts (issue 46).

A topic deleted and created again (or a partition added) is a new log: a watcher the stream
served that was away then reads it from its start when it resumes. Which watchers were away is
kept in the stream's memory (the asset state store, :mod:`.topic_memory`), so a restart knows it
too, even when the watcher's last position of the old topic, still in flight, landed on the new
one (FAULT_MODEL classes 3, 10, 14).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from typing import Any

import pytest

from airflow_shared_stream.testing import InMemoryStateStore, SharedStreamHarness
from tests.integration.kafka.test_kafka_cluster_changes import _until
from tests.integration.kafka.test_kafka_topic_memory_attacks import (
    _HeldCommits,
    _remembered_ids,
    _running_and_paused,
    second,
)
from tests.integration.kafka.test_kafka_watcher_away_attacks import _Rig

pytestmark = [pytest.mark.integration, pytest.mark.timeout(150)]

MEMORY_KEY_PREFIX = "shared_stream.kafka.topic_ids"


class _ReadsHeld(InMemoryStateStore):
    """A state store whose reads of the stream's memory wait for :attr:`gate` once it is set up."""

    def __init__(self) -> None:
        super().__init__()
        self.gate: asyncio.Event | None = None

    async def aget(self, key: str, default: Any = None) -> Any:
        if self.gate is not None and key.startswith(MEMORY_KEY_PREFIX):
            await self.gate.wait()
        return self.get(key, default)


async def _a_late_position_lands_on_the_new_topic(
    kafka: Any, monkeypatch: Any, store: Any
) -> tuple[Any, ...]:
    """
    One triggerer: two watchers read 20 records; one is paused and its last position (20) is held
    on its way while the topic is deleted and created again with 25 records, then lands on the new
    topic. The running watcher reads the new topic from its start; the memory takes the new id.
    """
    topic, group, running, paused, running_group, paused_group = await _running_and_paused(kafka, monkeypatch)
    held = _HeldCommits(paused_group, monkeypatch)
    async with SharedStreamHarness(confirm_after=0.0, state_store=store) as triggerer:
        a = triggerer.add(running)
        b = triggerer.add(paused)
        await kafka.produce(topic, [{"round": 1, "i": i} for i in range(20)])
        await a.wait_for_events(20)
        await b.wait_for_events(20)
        assert await kafka.wait_committed(paused_group, topic, {0: 20}) == {0: 20}
        await _until(lambda: bool(_remembered_ids(store)), "the stream's memory of its topic ids")
        old_ids = _remembered_ids(store)
        held.hold = True
        await triggerer.remove(b)
        await asyncio.wait_for(held.holding.wait(), 20)
        await kafka.delete_topic(topic, groups=(group, running_group, paused_group))
        await kafka.create_topics(topic)
        await kafka.produce(topic, [{"round": 2, "i": i} for i in range(25)])
        held.release.set()
        await asyncio.wait_for(held.landed.wait(), 30)
        await _until(
            lambda: set(second(a)) >= set(range(25)), "the running watcher's new records", timeout=30
        )
        await _until(lambda: _remembered_ids(store) - old_ids != set(), "the memory of the new id")
    held.hold = False
    assert (await kafka.committed(paused_group, topic)).get(0) == 20, "the late position did not land"
    return topic, running, paused


@pytest.mark.parametrize("kafka_broker", ["tansu"], indirect=True)  # the broker with topic ids
async def test_a_last_position_in_flight_across_a_re_creation_skips_nothing_after_a_restart(
    kafka, monkeypatch
):
    """
    Class 3 / 14, the restart form of ``test_a_last_position_in_flight_across_a_re_creation_skips_
    nothing_of_the_new_topic``. The paused watcher's last position (20, of the old topic) landed
    on the topic created again; the triggerer is then restarted (both watchers' triggers run on
    the new one). Broke: which watchers were away from the new log was kept in the old
    triggerer's process only, so the paused watcher resumed at 20 and never got the new topic's
    records 0-19 (silently). Now the memory keeps it: it reads the new topic from its start.
    """
    store = InMemoryStateStore()
    topic, running, paused = await _a_late_position_lands_on_the_new_topic(kafka, monkeypatch, store)
    async with SharedStreamHarness(confirm_after=0.0, state_store=store) as restarted:
        restarted.add(running)
        resumed = restarted.add(paused)
        await kafka.produce(topic, [{"round": 2, "i": 25}])
        with contextlib.suppress(AssertionError):
            await _until(lambda: set(second(resumed)) >= set(range(26)), "0-25", timeout=20)
        assert set(second(resumed)) >= set(range(26)), f"the paused watcher skipped: {second(resumed)}"


@pytest.mark.parametrize("kafka_broker", ["tansu"], indirect=True)  # the broker with topic ids
async def test_a_memory_answer_after_the_watchers_resumed_puts_an_away_watcher_back_at_the_new_logs_start(
    kafka, monkeypatch, caplog
):
    """
    Class 11 / 14: as above, but the restart's read of the memory answers only after both
    watchers were admitted (a slow supervisor: past the start's grace), so the paused watcher
    resumed at its late position 20 on the new topic. When the answer comes it is put back at the
    new log's start (WARNING): it gets the new topic's 0-25, some twice, none skipped.
    """
    caplog.set_level(logging.INFO, logger="airflow_shared_stream.kafka")
    store = _ReadsHeld()
    topic, running, paused = await _a_late_position_lands_on_the_new_topic(kafka, monkeypatch, store)
    store.gate = asyncio.Event()
    async with SharedStreamHarness(confirm_after=0.0, state_store=store) as restarted:
        restarted.add(running)
        resumed = restarted.add(paused)

        def joined_at_20() -> bool:
            return any("joined" in r.getMessage() and "0@20" in r.getMessage() for r in caplog.records)

        await _until(joined_at_20, "the paused watcher resumed at its late position 20")
        store.gate.set()
        await kafka.produce(topic, [{"round": 2, "i": 25}])
        with contextlib.suppress(AssertionError):
            await _until(lambda: set(second(resumed)) >= set(range(26)), "0-25", timeout=20)
        assert set(second(resumed)) >= set(range(26)), f"the paused watcher skipped: {second(resumed)}"
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("read after the watcher resumed at 20" in message for message in warnings), warnings


@pytest.mark.parametrize("kafka_broker", ["tansu", "noida-db"], indirect=True)
async def test_a_watcher_back_on_a_new_log_is_not_read_from_its_start_again_after_a_restart(
    kafka, monkeypatch
):
    """
    Class 14 / 3: the paused watcher resumes after a re-creation and reads the new log from its
    start (it was away). It is then no longer away: the memory must say so too, or the next
    start would take its position on the new log for one of the old topic sent late and read the
    new log from its start again for it, firing its Dag again for every record. After a restart
    it gets record 26 only.
    """
    rig = _Rig(kafka, monkeypatch)
    store = InMemoryStateStore()
    await kafka.create_topics(rig.topic)
    async with SharedStreamHarness(confirm_after=0.0, state_store=store) as triggerer:
        a = triggerer.add(rig.running)
        b = triggerer.add(rig.paused)
        await kafka.produce(rig.topic, [{"round": 1, "i": i} for i in range(20)])
        await a.wait_for_events(20)
        await b.wait_for_events(20)
        assert await kafka.wait_committed(rig.paused_group, rig.topic, {0: 20}) == {0: 20}
        await rig.pause(triggerer, b)
        await rig.recreate([{"round": 2, "i": i} for i in range(25)])
        await _until(lambda: set(second(a)) >= set(range(25)), "the running watcher's new records")
        resumed = triggerer.add(rig.paused)
        await kafka.produce(rig.topic, [{"round": 2, "i": 25}])
        await _until(lambda: set(second(resumed)) >= set(range(26)), "0-25 at the returning watcher")
        assert await kafka.wait_committed(rig.paused_group, rig.topic, {0: 26}) == {0: 26}
    async with SharedStreamHarness(confirm_after=0.0, state_store=store) as restarted:
        restarted.add(rig.running)
        again = restarted.add(rig.paused)
        await kafka.produce(rig.topic, [{"round": 2, "i": 26}])
        await _until(lambda: 26 in second(again), "record 26")
        assert await kafka.wait_committed(rig.paused_group, rig.topic, {0: 27}) == {0: 27}
        assert second(again) == [26], f"the new log was read again for a watcher back on it: {second(again)}"


def _served(store: InMemoryStateStore) -> set[str]:
    """The position groups the stream's memory in ``store`` names as served."""
    return {
        group
        for key, value in store.values.items()
        if key.startswith(MEMORY_KEY_PREFIX)
        for group in json.loads(value).get("served", ())
    }


@pytest.mark.parametrize("kafka_broker", ["tansu", "noida-db"], indirect=True)
async def test_a_watcher_served_only_before_a_restart_reads_a_log_created_while_it_was_paused_from_its_start(
    kafka, monkeypatch
):
    """
    Class 14 / 10: a watcher runs, is paused, and the triggerer restarts without it (its Dag
    stays paused). The restarted stream then sees its topic deleted and created again with 15
    records. When the watcher resumes it must get them all: it never saw the new topic. Broke:
    which watchers the stream served was kept in the process only, so the restarted stream did
    not know it as away, and it joined at the read position, skipping records 0-14 silently.
    """
    rig = _Rig(kafka, monkeypatch)
    store = InMemoryStateStore()
    await kafka.create_topics(rig.topic)
    async with SharedStreamHarness(confirm_after=0.0, state_store=store) as first:
        a = first.add(rig.running)
        b = first.add(rig.paused)
        await kafka.produce(rig.topic, [{"round": 1, "i": i} for i in range(10)])
        await a.wait_for_events(10)
        await b.wait_for_events(10)
        assert await kafka.wait_committed(rig.paused_group, rig.topic, {0: 10}) == {0: 10}
        await rig.pause(first, b)
    assert rig.paused_group in _served(store), "the memory does not name the paused watcher as served"
    async with SharedStreamHarness(confirm_after=0.0, state_store=store) as restarted:
        a = restarted.add(rig.running)
        await kafka.produce(rig.topic, [{"round": 1, "i": 10}])
        await a.wait_for_events(1)
        assert await kafka.wait_committed(rig.running_group, rig.topic, {0: 11}) == {0: 11}
        await rig.recreate([{"round": 2, "i": i} for i in range(15)])
        await _until(lambda: set(second(a)) >= set(range(15)), "the running watcher's new records")
        resumed = restarted.add(rig.paused)
        await kafka.produce(rig.topic, [{"round": 2, "i": 15}])
        with contextlib.suppress(AssertionError):
            await _until(lambda: set(second(resumed)) >= set(range(16)), "0-15", timeout=20)
        assert set(second(resumed)) >= set(range(16)), f"the paused watcher skipped: {second(resumed)}"
