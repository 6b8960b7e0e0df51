"""
Watchers' own positions across triggerers, against the real brokers: what may move a position.

A Kafka watcher's position (its committed offsets, under a group of its own) is the promise
"everything below was persisted for this watcher". These tests break that promise the ways a
deployment with several triggerers can: a watcher moved in behind the stream while the records
past its position are still in flight. Each :class:`SharedStreamHarness` is one triggerer.
"""

from __future__ import annotations

import pytest

from airflow_shared_stream.kafka.trigger import KafkaSharedStreamTrigger
from airflow_shared_stream.kafka.watchers import watcher_group_id
from airflow_shared_stream.testing import SharedStreamHarness

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


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
