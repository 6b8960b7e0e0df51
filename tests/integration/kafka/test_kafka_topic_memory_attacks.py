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
import logging
from typing import Any

import pytest

from airflow_shared_stream.kafka import cluster_watch
from airflow_shared_stream.kafka.positions import PositionStore
from airflow_shared_stream.kafka.trigger import KafkaSharedStreamTrigger
from airflow_shared_stream.kafka.watchers import watcher_group_id
from airflow_shared_stream.testing import SharedStreamHarness
from tests.integration.kafka.test_kafka_cluster_changes import _until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


@pytest.mark.xfail(
    strict=True,
    reason="a watcher's last position in flight across a re-creation lands on the new topic and "
    "the watcher resumes there, skipping the new topic's first records",
)
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
    rule does not apply) skips 0-19, silently. A restart skips them too (the memory holds the new
    id once the stream commits on it).
    """
    caplog.set_level(logging.INFO, logger="airflow_shared_stream.kafka")
    monkeypatch.setattr(cluster_watch, "CLUSTER_CHECK_INTERVAL", 0.2)
    topic = kafka.name("t")
    await kafka.create_topics(topic)
    group = kafka.name("g")

    def watcher(name: str) -> KafkaSharedStreamTrigger:
        return KafkaSharedStreamTrigger(
            [topic], kafka_config_id=kafka.conn_id, group_id=group, match=f"'{name}' != 'never'"
        )

    running, paused = watcher("running"), watcher("paused")
    paused_group = watcher_group_id(group, paused.watcher_digest())
    running_group = watcher_group_id(group, running.watcher_digest())

    holding, release, landed = asyncio.Event(), asyncio.Event(), asyncio.Event()
    hold = False
    commit = PositionStore.commit

    async def slow_to_arrive(store: PositionStore, grp: str, offsets: Any, *args: Any, **kwargs: Any) -> None:
        if hold and grp == paused_group and offsets:  # past the guard: the request is on its way
            holding.set()
            await release.wait()
            await commit(store, grp, offsets, *args, **kwargs)
            landed.set()
            return
        await commit(store, grp, offsets, *args, **kwargs)

    monkeypatch.setattr(PositionStore, "commit", slow_to_arrive)
    async with SharedStreamHarness(confirm_after=0.0) as triggerer:
        a = triggerer.add(running)
        b = triggerer.add(paused)
        await kafka.produce(topic, [{"round": 1, "i": i} for i in range(20)])
        await a.wait_for_events(20)
        await b.wait_for_events(20)
        assert await kafka.wait_committed(paused_group, topic, {0: 20}) == {0: 20}
        hold = True
        await triggerer.remove(b)  # its last position is sent in the background: held on its way
        await asyncio.wait_for(holding.wait(), 20)
        await kafka.delete_topic(topic, groups=(group, running_group, paused_group))
        await kafka.create_topics(topic)
        await kafka.produce(topic, [{"round": 2, "i": i} for i in range(25)])
        release.set()
        await asyncio.wait_for(landed.wait(), 30)

        def second(w: Any) -> list[int]:
            return [p["value"]["i"] for p in w.payloads if p["value"]["round"] == 2]

        await _until(
            lambda: set(second(a)) >= set(range(25)), "the running watcher's new records", timeout=30
        )
        resumed = triggerer.add(paused)
        await kafka.produce(topic, [{"round": 2, "i": 25}])
        with contextlib.suppress(AssertionError):
            await _until(lambda: set(second(resumed)) >= set(range(26)), "0-25", timeout=20)
        assert set(second(resumed)) >= set(range(26)), f"the paused watcher skipped: {second(resumed)}"
