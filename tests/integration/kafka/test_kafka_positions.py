"""
Watchers' own positions across triggerers, against the real brokers: what may move a position.

A Kafka watcher's position (its committed offsets, under a group of its own) is the promise
"everything below was persisted for this watcher". These tests break that promise the ways a
deployment with several triggerers can: a watcher moved in behind the stream while the records
past its position are still in flight; a stream idle for longer than the broker keeps offsets;
two triggerers running watchers that differ only in a shaping argument, which share one
position. Each :class:`SharedStreamHarness` is one triggerer.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import pytest

from airflow_shared_stream.common.errors import StreamShapeConflictError
from airflow_shared_stream.kafka import producer as producer_module
from airflow_shared_stream.kafka.marks import PositionMark
from airflow_shared_stream.kafka.trigger import KafkaSharedStreamTrigger
from airflow_shared_stream.kafka.watchers import stream_ref, watcher_group_id
from airflow_shared_stream.testing import SharedStreamHarness

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

LATEST = {"auto.offset.reset": "latest"}


async def test_a_watcher_admitted_behind_is_not_moved_by_records_in_flight_it_never_received(kafka):
    """
    A watcher that arrives with its position behind the stream (moved here from a triggerer that
    died before persisting) gets the records past its position from a seek back. The first copies
    of those records are still in flight for the watcher already here; when they settle, they
    must not move the newcomer's position: it never received them. If they did, its position
    would pass records it has not persisted, and the next triggerer to run it would skip them.
    """
    topic = kafka.name("t")
    await kafka.create_topics(topic)
    group = kafka.name("g")
    common = {"kafka_config_id": kafka.conn_id, "group_id": group}
    stayer = KafkaSharedStreamTrigger([topic], **common, match="value.i > `-1`")
    mover = KafkaSharedStreamTrigger([topic], **common, match="value.i > `-2`")
    stayer_group = watcher_group_id(group, stayer.watcher_digest())
    mover_group = watcher_group_id(group, mover.watcher_digest())
    await kafka.commit(mover_group, topic, {0: 0})  # where the triggerer that died left it
    async with SharedStreamHarness(confirm_after=None) as triggerer:
        s = triggerer.add(stayer)
        await kafka.produce(topic, [{"i": i} for i in range(10)])
        await s.wait_for_events(10)
        first_copies = list(triggerer._unconfirmed)  # bound by the stayer alone, not persisted yet
        m = triggerer.add(mover)
        await m.wait_for_events(10)  # the re-read copies, from its position
        triggerer.confirm(first_copies)
        ends = {0: 10}
        assert await kafka.wait_committed(stayer_group, topic, ends) == ends
        # This triggerer dies now, before the mover's events are persisted.
    assert await kafka.committed(mover_group, topic) == {0: 0}, (
        "the newcomer's position passed records it never persisted"
    )
    async with SharedStreamHarness(confirm_after=0.0) as elsewhere:
        moved = elsewhere.add(mover)
        await moved.wait_for_events(10)
        assert sorted(p["value"]["i"] for p in moved.payloads) == list(range(10))
        assert await kafka.wait_committed(mover_group, topic, ends) == ends
        assert moved.error is None


# noida-db only: Tansu 0.6.0 answers the first commit to a group deleted this way by closing the
# connection (it applies the commit, but the client sees an error and the stream fails).
@pytest.mark.parametrize("kafka_broker", ["noida-db"], indirect=True)
async def test_an_idle_watchers_position_is_committed_again_so_retention_never_expires_it(kafka, monkeypatch):
    """
    A broker expires the offsets of a group without members ``offsets.retention.minutes`` (7
    days by default) after their last commit. Positions are committed when records settle, so on
    an idle stream they would expire, and the next start (a restart, a failover) would fall back
    to ``auto.offset.reset``: with ``latest``, skipping what was produced meanwhile.

    Neither broker here can be given a short retention (noida-db and Tansu have no such setting,
    and both ignore the per-commit ``retention_time_ms``), so the expiry is played by deleting the
    groups, which is what the broker's expiry leaves behind. Live positions must come back.
    """
    monkeypatch.setattr(producer_module, "POSITION_REFRESH_INTERVAL", 0.5)
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
        await kafka.produce(topic, [{"round": 1, "i": i} for i in range(5)])
        await w.wait_for_events(5)
        assert await kafka.wait_committed(own_group, topic, {0: 5}) == {0: 5}
        # Idle from here on. Retention runs out for both the stream's and the watcher's group.
        # delete_groups asserts the broker's answer for each group. Reading the offsets back here
        # would race the 0.5 s refresh, which may already have committed them again on a loaded
        # machine (seen: {0: 5} instead of {0: None}).
        await kafka.delete_groups(own_group, group)
        assert await kafka.wait_committed(own_group, topic, {0: 5}) == {0: 5}, "position expired"
        assert await kafka.wait_committed(group, topic, {0: 5}) == {0: 5}, "stream start expired"
    await kafka.produce(topic, [{"round": 2, "i": i} for i in range(5)])  # while nothing runs
    async with SharedStreamHarness(confirm_after=0.0) as failover:
        moved = failover.add(trigger)
        await moved.wait_for_events(5)
        assert [(p["value"]["round"], p["value"]["i"]) for p in moved.payloads] == [(2, i) for i in range(5)]


# -- watchers that differ only in a shaping argument share one position -----------------------
# noida-db only: Tansu 0.6.0 drops the metadata of a commit (it returns ""), which is where a
# position's mark lives, so another triggerer's shape cannot be seen there (docs/kafka.rst).


def _shaped_twins(kafka, topic: str, group: str) -> tuple[KafkaSharedStreamTrigger, KafkaSharedStreamTrigger]:
    """Two watchers that select alike and differ only in a shaping argument: one identity."""
    common = {"kafka_config_id": kafka.conn_id, "group_id": group, "match": "value.i > `-1`"}
    first = KafkaSharedStreamTrigger([topic], **common, max_payload_bytes=1000)
    second = KafkaSharedStreamTrigger([topic], **common, max_payload_bytes=2000)
    assert first.watcher_digest() == second.watcher_digest()
    return first, second


def _refused(triggerer: SharedStreamHarness, trigger: KafkaSharedStreamTrigger) -> bool:
    """Whether ``triggerer`` refused the watcher (its registry entry, as the producer left it)."""
    streams = triggerer._scope.get("kafka.stream_watchers", {})
    watchers = streams.get(stream_ref(trigger.topics, trigger.kafka_config_id, trigger.group_id))
    cursor = None if watchers is None else watchers.cursors.get(trigger.watcher_digest())
    return cursor is not None and cursor.conflict is not None


async def _until(condition: Callable[[], bool], what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out after {timeout}s waiting for {what}"
        await asyncio.sleep(0.05)


@pytest.mark.parametrize("kafka_broker", ["noida-db"], indirect=True)
async def test_watchers_differing_only_in_shape_on_two_triggerers_fail_loudly_not_share_a_position(kafka):
    """
    On one triggerer the second of two such watchers fails (its shape disagrees with the
    stream's). On two, each triggerer builds its own consumer and both would commit under the one
    position their identity names: the faster one commits past records the slower one has not
    persisted, and when the slower one moves it skips them. The second must fail instead.
    """
    topic = kafka.name("t")
    await kafka.create_topics(topic)
    group = kafka.name("g")
    first, second = _shaped_twins(kafka, topic, group)
    position = watcher_group_id(group, first.watcher_digest())
    async with (
        SharedStreamHarness(confirm_after=None) as slow_triggerer,
        SharedStreamHarness(confirm_after=0.0) as fast_triggerer,
    ):
        slow = slow_triggerer.add(first)
        assert await kafka.wait_committed(position, topic, {0: 0}) == {0: 0}  # started, marked
        fast = fast_triggerer.add(second)
        await kafka.produce(topic, [{"i": i} for i in range(10)])
        await slow.wait_for_events(10)  # in flight there: its database is slow
        error = await fast.wait_for_error()
        assert isinstance(error, StreamShapeConflictError), error
        assert "max_payload_bytes=1000 (here 2000)" in str(error)
        assert fast.events == []
        assert slow.error is None
        # The slow triggerer dies before persisting.
    assert await kafka.committed(position, topic) == {0: 0}, (
        "the other triggerer committed past records this one never persisted"
    )


@pytest.mark.parametrize("kafka_broker", ["noida-db"], indirect=True)
async def test_a_watcher_whose_position_another_shape_starts_writing_is_refused_at_the_next_refresh(
    kafka, monkeypatch
):
    """
    Two triggerers can admit such watchers at the same moment, before either has marked the
    position; the periodic refresh reads the position first and finds the other's mark. Played
    here by committing the other triggerer's live mark by hand: from then on this watcher must
    not write the position, and it fails at its next record.
    """
    monkeypatch.setattr(producer_module, "POSITION_REFRESH_INTERVAL", 0.3)
    topic = kafka.name("t")
    await kafka.create_topics(topic)
    group = kafka.name("g")
    first, second = _shaped_twins(kafka, topic, group)
    position = watcher_group_id(group, first.watcher_digest())
    async with SharedStreamHarness(confirm_after=0.0) as triggerer:
        w = triggerer.add(first)
        await kafka.produce(topic, [{"i": i} for i in range(3)])
        await w.wait_for_events(3)
        assert await kafka.wait_committed(position, topic, {0: 3}) == {0: 3}
        theirs = PositionMark(second.normalized_shape(), time.time()).encode()
        await kafka.commit(position, topic, {0: 2}, metadata=theirs)
        # The next refresh reads their mark and refuses the watcher: it writes the position no more.
        await _until(lambda: _refused(triggerer, first), "the refresh to refuse the watcher")
        assert await kafka.committed_metadata(position, topic) == theirs
        await kafka.produce(topic, [{"i": 3}])
        error = await w.wait_for_error()
        assert isinstance(error, StreamShapeConflictError), error
        assert "max_payload_bytes=2000 (here 1000)" in str(error)
    assert await kafka.committed(position, topic) == {0: 2}


@pytest.mark.parametrize("kafka_broker", ["noida-db"], indirect=True)
async def test_a_redeploy_with_other_tuning_on_another_triggerer_resumes_the_same_position(kafka):
    """
    Tuning is not identity: a watcher redeployed with another ``max_payload_bytes`` keeps its
    position, also when it starts on another triggerer right after the old one stopped (the old
    one's last mark says it left, so it is no conflict) and nothing produced meanwhile is skipped.
    """
    topic = kafka.name("t")
    await kafka.create_topics(topic)
    group = kafka.name("g")
    before, after = _shaped_twins(kafka, topic, group)
    position = watcher_group_id(group, before.watcher_digest())
    async with SharedStreamHarness(confirm_after=0.0) as old_triggerer:
        w = old_triggerer.add(before)
        await kafka.produce(topic, [{"i": i} for i in range(5)])
        await w.wait_for_events(5)
        assert await kafka.wait_committed(position, topic, {0: 5}) == {0: 5}
    await kafka.produce(topic, [{"i": i} for i in range(5, 10)])
    async with SharedStreamHarness(confirm_after=0.0) as new_triggerer:
        redeployed = new_triggerer.add(after)
        await redeployed.wait_for_events(5)
        assert [p["value"]["i"] for p in redeployed.payloads] == list(range(5, 10))
        assert await kafka.wait_committed(position, topic, {0: 10}) == {0: 10}
        assert redeployed.error is None
