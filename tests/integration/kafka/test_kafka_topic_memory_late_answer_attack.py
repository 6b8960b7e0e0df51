"""
Attacks on the stream's memory of the watchers away from a new log (issue 46, FAULT_MODEL 3, 11, 14).

The memory's answer at a start can come at any moment after the 1 s grace (a loaded supervisor);
the stream admits watchers meanwhile, and each admission awaits the broker several times
(the watcher's position, the log bounds, the anchoring commit).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

import pytest

from airflow_shared_stream import testing
from airflow_shared_stream.kafka import topic_memory
from airflow_shared_stream.kafka.positions import PositionStore
from airflow_shared_stream.testing import InMemoryStateStore, SharedStreamHarness
from tests.integration.kafka.test_kafka_cluster_changes import _until
from tests.integration.kafka.test_kafka_topic_memory_attacks import _remembered_ids, second
from tests.integration.kafka.test_kafka_topic_memory_away import (
    _a_late_position_lands_on_the_new_topic,
    _ReadsHeld,
)
from tests.integration.kafka.test_kafka_watcher_away_attacks import _Rig

pytestmark = [pytest.mark.integration, pytest.mark.timeout(150)]


@pytest.mark.parametrize("kafka_broker", ["tansu"], indirect=True)  # the broker with topic ids
async def test_a_memory_answer_landing_during_an_away_watchers_admission_skips_nothing(
    kafka, monkeypatch, caplog
):
    """
    Class 11 / 14 / 3: as ``test_a_memory_answer_after_the_watchers_resumed_puts_an_away_watcher_
    back_at_the_new_logs_start``, but the restart's memory answers while the paused watcher is
    being admitted: after its position (20, of the old topic, sent late) was read and compared
    with the new logs (none known yet), before its admission ends (here: while its anchoring
    commit is on its way). ``WatcherPositions.recall`` puts back only watchers already admitted
    (``since_seq`` set at the very end of the admission), and the admission goes on with what it
    computed before the answer: the watcher resumes at 20 and never gets the new topic's records
    0-19, silently. Now an admission that ends with its watcher named away from a new log it was
    not named away from when its position was read puts it back at the next pass (WARNING ``...
    read after the watcher resumed at 20``): it gets 0-25 (duplicates allowed).
    """
    caplog.set_level(logging.INFO, logger="airflow_shared_stream.kafka")
    store = _ReadsHeld()
    topic, running, paused = await _a_late_position_lands_on_the_new_topic(kafka, monkeypatch, store)
    paused_suffix = f".watcher-{paused.watcher_digest()}"
    store.gate = asyncio.Event()
    applied = asyncio.Event()
    recall = topic_memory.TopicMemory._recall

    def recalled(memory: Any, *args: Any, **kwargs: Any) -> None:
        recall(memory, *args, **kwargs)
        applied.set()

    monkeypatch.setattr(topic_memory.TopicMemory, "_recall", recalled)
    commit = PositionStore.commit_asking_again

    async def answer_meanwhile(position_store: PositionStore, group: str, *args: Any, **kwargs: Any) -> Any:
        if not store.gate.is_set() and group.endswith(paused_suffix):  # its anchoring commit
            store.gate.set()  # the supervisor answers now, in the middle of the admission
            await asyncio.wait_for(applied.wait(), 30)
        return await commit(position_store, group, *args, **kwargs)

    monkeypatch.setattr(PositionStore, "commit_asking_again", answer_meanwhile)
    async with SharedStreamHarness(confirm_after=0.0, state_store=store) as restarted:
        restarted.add(running)
        resumed = restarted.add(paused)
        await _until(applied.is_set, "the memory's answer, during the paused watcher's admission")
        await kafka.produce(topic, [{"round": 2, "i": 25}])
        with contextlib.suppress(AssertionError):
            await _until(lambda: set(second(resumed)) >= set(range(26)), "0-25", timeout=20)
        assert set(second(resumed)) >= set(range(26)), f"the paused watcher skipped: {second(resumed)}"
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("read after the watcher resumed at 20" in message for message in warnings), warnings


def _one_store_per_asset(monkeypatch: Any, stores: dict[str, InMemoryStateStore]) -> None:
    """Each trigger gets the state store of its own asset (keyed by its ``match``), as Airflow gives."""
    rebuild = testing._rebuild

    def rebuilt_with_its_asset(trigger: Any) -> Any:
        rebuilt = rebuild(trigger)
        rebuilt.asset_state_store = stores[trigger.serialize()[1]["match"]]
        return rebuilt

    monkeypatch.setattr(testing, "_rebuild", rebuilt_with_its_asset)


@pytest.mark.parametrize("kafka_broker", ["tansu"], indirect=True)  # the broker with topic ids
async def test_a_memory_left_stale_in_a_paused_watchers_asset_does_not_make_a_restart_re_read_a_topic(
    kafka, monkeypatch
):
    """
    Class 10 / 3 / 11: the memory is kept in each watcher's own asset, and a start reads the first
    that holds one, lowest trigger id first. Run 1 serves watchers ``paused`` (the lower trigger
    id) and ``running``: both assets hold the memory (topic id 1). ``paused``'s Dag is paused and
    the triggerer restarts: run 2 serves ``running`` only, follows a re-creation of the topic
    (reads it from its start, 5 records) and writes the new id to ``running``'s asset only (the
    paused watcher's asset is not written by a stream it is not part of). ``paused`` resumes and
    the triggerer restarts again: run 3 reads ``paused``'s asset first, whose memory still says
    topic id 1, and takes the topic it followed and committed on for days for one created again
    while no stream ran: it reads it again from its start for every watcher, so ``running``'s Dag
    fires again for records 0-4 (broke so). Now each write of a change raises the memory's
    ``generation`` and a start takes the newest it reads: ``running`` gets record 5 only
    (``paused`` reads the new log from its start: it was away).
    """
    rig = _Rig(kafka, monkeypatch)
    stores = {"'running' != 'never'": InMemoryStateStore(), "'paused' != 'never'": InMemoryStateStore()}
    _one_store_per_asset(monkeypatch, stores)
    running_store, paused_store = stores["'running' != 'never'"], stores["'paused' != 'never'"]
    await kafka.create_topics(rig.topic)
    async with SharedStreamHarness(confirm_after=0.0) as first:
        b = first.add(rig.paused)  # the lower trigger id
        a = first.add(rig.running)
        await kafka.produce(rig.topic, [{"round": 1, "i": i} for i in range(10)])
        await a.wait_for_events(10)
        await b.wait_for_events(10)
        await _until(
            lambda: bool(_remembered_ids(running_store)) and bool(_remembered_ids(paused_store)),
            "the memory in both assets",
        )
    old_ids = _remembered_ids(running_store)
    async with SharedStreamHarness(confirm_after=0.0) as second_run:
        a = second_run.add(rig.running)
        await kafka.produce(rig.topic, [{"round": 1, "i": 10}])
        await _until(lambda: 10 in [p["value"]["i"] for p in a.payloads], "record 10")
        await rig.recreate([{"round": 2, "i": i} for i in range(5)])
        await _until(lambda: set(second(a)) >= set(range(5)), "the new topic, from its start")
        assert await kafka.wait_committed(rig.running_group, rig.topic, {0: 5}) == {0: 5}
        await _until(lambda: _remembered_ids(running_store) - old_ids != set(), "the memory of the new id")
    async with SharedStreamHarness(confirm_after=0.0) as third_run:
        back = third_run.add(rig.paused)  # the lower trigger id again
        a = third_run.add(rig.running)
        await kafka.produce(rig.topic, [{"round": 2, "i": 5}])
        await _until(lambda: set(second(back)) >= set(range(6)), "the new log at the watcher away from it")
        await _until(lambda: 5 in second(a), "record 5")
        assert await kafka.wait_committed(rig.running_group, rig.topic, {0: 6}) == {0: 6}
        assert second(a) == [5], f"the followed topic was read again for the running watcher: {second(a)}"
