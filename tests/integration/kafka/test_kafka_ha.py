"""
Several triggerers on one Kafka stream: every watcher sees every record, and a watcher
that moves to another triggerer resumes from its own durable position.

Each :class:`SharedStreamHarness` plays one triggerer process (its own manager, its own consumer,
its own per-process watcher registry), so two of them in one test are two triggerers on one
topic, against the real brokers (noida-db and Tansu).
"""

from __future__ import annotations

import pytest

from airflow_shared_stream.kafka.trigger import KafkaSharedStreamTrigger
from airflow_shared_stream.kafka.watchers import stream_ref, watcher_group_id
from airflow_shared_stream.testing import SharedStreamHarness

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

PARTITIONS = 4


async def _produce_round(kafka, topic: str, round_no: int, count: int = 10) -> None:
    for p in range(PARTITIONS):
        await kafka.produce(topic, [{"p": p, "r": round_no, "i": i} for i in range(count)], partition=p)


def _seen(watcher, round_no: int | None = None) -> list[tuple[int, int, int]]:
    found = [(e["value"]["p"], e["value"]["r"], e["value"]["i"]) for e in watcher.payloads]
    return [x for x in found if round_no is None or x[1] == round_no]


def _round(round_no: int, count: int = 10) -> set[tuple[int, int, int]]:
    return {(p, round_no, i) for p in range(PARTITIONS) for i in range(count)}


async def _started(kafka, topic: str, group: str, *triggers: KafkaSharedStreamTrigger) -> None:
    """
    Wait until each brand-new watcher has started: its own position anchored at every partition's start.

    ``SharedStreamHarness.add`` only starts the trigger's task. A brand-new watcher starts where
    its triggerer's stream reads when that triggerer admits it (docs/ha.rst): the stream group's
    commit, which the triggerers share. Records produced before a triggerer admits its watcher
    may already be committed past by the other triggerer (it reads, persists and commits a round
    in ~30 ms), and the late watcher then rightly starts after them and never sees them: one
    triggerer ~50 ms behind the other was enough to leave a watcher with 0 of 40 events.
    """
    starts = dict.fromkeys(range(PARTITIONS), 0)
    for trigger in triggers:
        watcher_group = watcher_group_id(group, trigger.watcher_digest())
        seen = await kafka.wait_committed(watcher_group, topic, starts, PARTITIONS)
        assert seen == starts, f"watcher {watcher_group} did not start at the beginning: {seen}"


async def _two_watchers_of_one_topic(
    kafka,
) -> tuple[str, str, KafkaSharedStreamTrigger, KafkaSharedStreamTrigger]:
    """A fresh topic of PARTITIONS partitions and two watchers of it that select differently."""
    topic = kafka.name("t")
    await kafka.create_topics(topic, partitions=PARTITIONS)
    group = kafka.name("g")
    common = {"kafka_config_id": kafka.conn_id, "group_id": group}
    return (
        topic,
        group,
        KafkaSharedStreamTrigger([topic], **common, match="value.r > `0`"),
        KafkaSharedStreamTrigger([topic], **common, match="value.r > `-1`"),
    )


async def test_watchers_of_one_stream_on_two_triggerers_each_see_every_record(kafka):
    topic, group, first, second = await _two_watchers_of_one_topic(kafka)
    async with SharedStreamHarness() as triggerer_a, SharedStreamHarness() as triggerer_b:
        a = triggerer_a.add(first)
        b = triggerer_b.add(second)
        await _started(kafka, topic, group, first, second)
        await _produce_round(kafka, topic, 1)
        await a.wait_for_events(40)
        await b.wait_for_events(40)
        assert set(_seen(a)) == set(_seen(b)) == _round(1)
        # Each watcher's own position reaches the end of every partition.
        stream = stream_ref([topic], kafka.conn_id, group)
        for trigger in (first, second):
            watcher_group = watcher_group_id(group, trigger.watcher_digest())
            ends = {p: 10 for p in range(PARTITIONS)}
            assert await kafka.wait_committed(watcher_group, topic, ends, PARTITIONS) == ends, stream
        assert a.error is None
        assert b.error is None


async def test_a_watcher_moved_to_another_triggerer_resumes_from_its_own_position(kafka):
    topic, group, mover, stayer = await _two_watchers_of_one_topic(kafka)
    mover_group = watcher_group_id(group, mover.watcher_digest())
    async with SharedStreamHarness() as triggerer_b:
        s = triggerer_b.add(stayer)
        async with SharedStreamHarness() as triggerer_a:
            m = triggerer_a.add(mover)
            await _started(kafka, topic, group, stayer, mover)
            await _produce_round(kafka, topic, 1)
            await m.wait_for_events(40)
            ends = {p: 10 for p in range(PARTITIONS)}
            assert await kafka.wait_committed(mover_group, topic, ends, PARTITIONS) == ends
            # Triggerer A's database goes away: round 2 reaches the mover but is never persisted.
            triggerer_a.persisting = False
            await _produce_round(kafka, topic, 2)
            await m.wait_for_events(80)
            await s.wait_for_events(80)
        # A is gone; its watcher moves to B, which has read everything already.
        assert await kafka.committed(mover_group, topic, PARTITIONS) == ends
        moved = triggerer_b.add(mover)
        await moved.wait_for_events(40)
        assert set(_seen(moved)) == _round(2), "the moved watcher must get what it never persisted"
        await _produce_round(kafka, topic, 3)
        await moved.wait_for_events(80)
        await s.wait_for_events(120)
        assert set(_seen(moved)) == _round(2) | _round(3)
        # The watcher that stayed saw everything; the re-read for the mover skipped its records.
        assert set(_seen(s)) == _round(1) | _round(2) | _round(3)
        assert len(_seen(s, 2)) == 40, "the stayer fired again for records it had already passed"
        all_thirty = {p: 30 for p in range(PARTITIONS)}
        assert await kafka.wait_committed(mover_group, topic, all_thirty, PARTITIONS) == all_thirty
        assert moved.error is None
        assert s.error is None


async def test_a_brand_new_watcher_starts_at_the_streams_read_position_and_anchors_it(kafka):
    """
    The rule for a new watcher of a running stream: it starts "now" (where the stream
    reads), not at the topic's beginning, and that start is committed as its own position before
    its first record, so a move to another triggerer before then resumes there.
    """
    topic, group, first, late = await _two_watchers_of_one_topic(kafka)
    late_group = watcher_group_id(group, late.watcher_digest())
    ends = {p: 10 for p in range(PARTITIONS)}
    async with SharedStreamHarness() as triggerer:
        a = triggerer.add(first)
        await _produce_round(kafka, topic, 1)
        await a.wait_for_events(40)
        b = triggerer.add(late)
        # Anchored before any record reached it.
        assert await kafka.wait_committed(late_group, topic, ends, PARTITIONS) == ends
        assert b.payloads == []
        await _produce_round(kafka, topic, 2)
        await b.wait_for_events(40)
        await a.wait_for_events(80)
        assert set(_seen(b)) == _round(2)
        twenty = {p: 20 for p in range(PARTITIONS)}
        assert await kafka.wait_committed(late_group, topic, twenty, PARTITIONS) == twenty
