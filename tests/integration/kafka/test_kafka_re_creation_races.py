"""
Races between a topic's re-creation and the settlement of its old log's records (issue 46,
FAULT_MODEL classes 3, 13, 14), on real brokers.

The stream keeps ACK-only advances and folds them into positions at its committer's next round
(``LaneSettler.keep_acks``). Under load that round comes late: here it is held (the committer's
round of a loaded loop, or one waiting on a slow commit request) while the topic is deleted and
created again, and released once the stream has started reading the new log.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

import pytest

from airflow_shared_stream.kafka import cluster_watch
from airflow_shared_stream.kafka.dead_letter import DeadLetterWriter
from airflow_shared_stream.kafka.positions import PositionStore
from airflow_shared_stream.kafka.producer import KafkaSharedStreamProducer
from airflow_shared_stream.kafka.trigger import KafkaSharedStreamTrigger
from airflow_shared_stream.kafka.watchers import watcher_group_id
from airflow_shared_stream.testing import SharedStreamHarness
from tests.integration.kafka.test_kafka_cluster_changes import _until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

POSITIONS_LOG = "airflow_shared_stream.kafka"


class _LateRounds:
    """Holds the stream's folds of kept ACKs (its committer's rounds) until :meth:`release`."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.held = True
        self.producers: list[KafkaSharedStreamProducer] = []
        fold = KafkaSharedStreamProducer.fold_advanced_acks
        rounds = self

        def late_fold(producer: KafkaSharedStreamProducer) -> None:
            if producer not in rounds.producers:
                rounds.producers.append(producer)
            if not rounds.held:
                fold(producer)

        monkeypatch.setattr(KafkaSharedStreamProducer, "fold_advanced_acks", late_fold)

    def release(self) -> None:
        """The late round comes: everything kept is folded now."""
        self.held = False
        for producer in self.producers:
            producer.fold_advanced_acks()


def _round(handle: Any, n: int) -> list[int]:
    return [p["value"]["i"] for p in handle.payloads if p["value"].get("round") == n]


@pytest.mark.parametrize("kafka_broker", ["tansu", "noida-db"], indirect=True)
async def test_acks_of_the_old_log_folded_after_the_re_creation_move_no_position_on_the_new_log(
    kafka, monkeypatch, caplog
):
    """
    The running watcher read records 0-9 of the topic; their ACKs wait for the committer's round.
    The topic is deleted and created again, and the stream starts the new log at 0 (WARNING).
    Then the late round folds the old log's ACKs: they must move no position on the new log.
    Broke: they moved the watcher's position and the stream's commit from 0 to 10 on the new
    log, so the watcher's filter skipped the new log's records 0-3 (passed, it thought) and the
    stream committed 10 (a restart would skip them too).
    """
    caplog.set_level(logging.INFO, logger=POSITIONS_LOG)
    monkeypatch.setattr(cluster_watch, "CLUSTER_CHECK_INTERVAL", 0.2)
    rounds = _LateRounds(monkeypatch)
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
        await _until(
            lambda: any("is a new log" in r.getMessage() for r in caplog.records), "the new log's detection"
        )
        rounds.release()
        await kafka.produce(topic, [{"round": 2, "i": i} for i in range(4)])
        with contextlib.suppress(AssertionError):
            await _until(lambda: set(_round(w, 2)) >= set(range(4)), "0-3 of the new log")
        assert set(_round(w, 2)) == set(range(4)), f"the new log's records were skipped: {_round(w, 2)}"
        assert await kafka.wait_committed(own_group, topic, {0: 4}) == {0: 4}
        assert await kafka.wait_committed(group, topic, {0: 4}) == {0: 4}
        assert w.error is None, w.error


@pytest.mark.parametrize("kafka_broker", ["tansu", "noida-db"], indirect=True)
async def test_a_dead_letter_of_the_old_log_sent_across_the_re_creation_moves_no_position_on_the_new_log(
    kafka, monkeypatch, caplog
):
    """
    Record 0 of the topic is rejected; its dead-letter send is slow (held) while record 1 fires,
    and the topic is deleted and created again meanwhile. The send then completes and the batch
    is folded: it must move no position on the new log. Broke (before the fold checked the log):
    the watcher's position and the stream's commit moved over the new log's first offsets.
    """
    caplog.set_level(logging.INFO, logger=POSITIONS_LOG)
    monkeypatch.setattr(cluster_watch, "CLUSTER_CHECK_INTERVAL", 0.2)
    sending, release, sent = asyncio.Event(), asyncio.Event(), asyncio.Event()
    write = DeadLetterWriter.write

    async def slow_write(writer: DeadLetterWriter, payloads: Any) -> None:
        sending.set()
        await release.wait()
        await write(writer, payloads)
        sent.set()

    monkeypatch.setattr(DeadLetterWriter, "write", slow_write)
    topic, dead, group = kafka.name("t"), kafka.name("dl"), kafka.name("g")
    await kafka.create_topics(topic, dead)
    trigger = KafkaSharedStreamTrigger(
        [topic],
        kafka_config_id=kafka.conn_id,
        group_id=group,
        dead_letter_topic=dead,
        reject="value.kind == 'bad'",
    )
    own_group = watcher_group_id(group, trigger.watcher_digest())
    async with SharedStreamHarness(confirm_after=0.0) as triggerer:
        w = triggerer.add(trigger)
        assert await kafka.wait_committed(own_group, topic, {0: 0}) == {0: 0}
        await kafka.produce(topic, [{"round": 1, "kind": "bad", "i": 0}, {"round": 1, "kind": "ok", "i": 1}])
        await asyncio.wait_for(sending.wait(), 30)
        await w.wait_for_events(1)
        await kafka.delete_topic(topic, groups=(group, own_group))
        await kafka.create_topics(topic)
        await _until(
            lambda: any("is a new log" in r.getMessage() for r in caplog.records), "the new log's detection"
        )
        release.set()
        await asyncio.wait_for(sent.wait(), 30)
        await kafka.produce(topic, [{"round": 2, "kind": "ok", "i": i} for i in range(4)])
        with contextlib.suppress(AssertionError):
            await _until(lambda: set(_round(w, 2)) >= set(range(4)), "0-3 of the new log")
        assert set(_round(w, 2)) == set(range(4)), f"the new log's records were skipped: {_round(w, 2)}"
        assert await kafka.wait_committed(own_group, topic, {0: 4}) == {0: 4}
        assert await kafka.wait_committed(group, topic, {0: 4}) == {0: 4}
        assert w.error is None, w.error


@pytest.mark.parametrize("kafka_broker", ["tansu", "noida-db"], indirect=True)
async def test_a_position_commit_while_the_topic_is_gone_does_not_fail_the_stream(kafka, monkeypatch, caplog):
    """
    Class 11 / 14: the topic stays deleted for a while (an operator re-creating it by hand) and
    the running watcher's position is committed meanwhile (its minutely refresh, here every
    0.2 s; or a commit of records it read, late under load). Kafka answers a commit of a deleted
    topic's offsets ``UNKNOWN_TOPIC_OR_PARTITION``. Broke: that failed the whole stream, and the
    restarted stream had forgotten which watchers were away, so the paused watcher resumed at
    the read position and skipped the new log (seen under load: ``skipped: [4]``). The commit
    is dropped (the new log's start is committed when the stream sees it) and the stream lives on.
    """
    from airflow_shared_stream.kafka import producer as producer_module

    caplog.set_level(logging.INFO, logger=POSITIONS_LOG)
    monkeypatch.setattr(cluster_watch, "CLUSTER_CHECK_INTERVAL", 0.2)
    monkeypatch.setattr(producer_module, "POSITION_REFRESH_INTERVAL", 0.2)
    topic, group = kafka.name("t"), kafka.name("g")
    await kafka.create_topics(topic)

    def watcher(name: str) -> KafkaSharedStreamTrigger:
        return KafkaSharedStreamTrigger(
            [topic], kafka_config_id=kafka.conn_id, group_id=group, match=f"'{name}' != 'never'"
        )

    running, paused = watcher("running"), watcher("paused")
    groups = (group, *(watcher_group_id(group, w.watcher_digest()) for w in (running, paused)))
    gone, committed_while_gone = [False], asyncio.Event()
    commit = PositionStore.commit

    async def noting_commit(store: PositionStore, *args: Any, **kwargs: Any) -> None:
        try:
            await commit(store, *args, **kwargs)
        finally:
            if gone[0]:
                committed_while_gone.set()

    monkeypatch.setattr(PositionStore, "commit", noting_commit)
    async with SharedStreamHarness(confirm_after=0.0) as triggerer:
        a = triggerer.add(running)
        b = triggerer.add(paused)
        await kafka.produce(topic, [{"round": 1, "i": i} for i in range(5)])
        await a.wait_for_events(5)
        await b.wait_for_events(5)
        assert await kafka.wait_committed(groups[2], topic, {0: 5}) == {0: 5}
        await triggerer.remove(b)
        assert await kafka.wait_committed(groups[2], topic, {0: 5}) == {0: 5}
        await kafka.delete_topic(topic, groups=groups)
        gone[0] = True
        await asyncio.wait_for(committed_while_gone.wait(), 30)
        gone[0] = False
        await kafka.create_topics(topic)
        await kafka.produce(topic, [{"round": 2, "i": i} for i in range(6)])
        with contextlib.suppress(AssertionError):
            await _until(lambda: set(_round(a, 2)) >= set(range(6)), "the running watcher's new log")
        assert a.error is None, a.error
        assert set(_round(a, 2)) >= set(range(6)), _round(a, 2)
        resumed = triggerer.add(paused)
        await kafka.produce(topic, [{"round": 2, "i": 6}])
        with contextlib.suppress(AssertionError):
            await _until(lambda: set(_round(resumed, 2)) >= set(range(7)), "0-6 of the new log")
        assert set(_round(resumed, 2)) >= set(range(7)), f"skipped: {_round(resumed, 2)}"
