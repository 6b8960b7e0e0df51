"""Per-watcher positions: identity, the skip rule, and the committer's final flush."""

from __future__ import annotations

import asyncio

import pytest
from aiokafka import TopicPartition

from airflow_shared_stream.common.matching import RawMessage
from airflow_shared_stream.common.process_scope import triggerer_scope
from airflow_shared_stream.kafka.committer import OffsetCommitter
from airflow_shared_stream.kafka.errors import KafkaSharedStreamError
from airflow_shared_stream.kafka.trigger import KafkaSharedStreamTrigger
from airflow_shared_stream.kafka.watchers import StreamWatchers, watcher_group_id, watchers_of

TP = TopicPartition("orders", 0)


def _message(offset: int, partition: int = 0) -> RawMessage:
    envelope = {"topic": "orders", "partition": partition, "offset": offset, "value": {}}
    return RawMessage(envelope=envelope, label=f"orders/{partition}@{offset}")


def test_a_watchers_identity_ignores_tuning_and_follows_what_it_selects():
    base = KafkaSharedStreamTrigger(["orders"], match="value.a")
    tuned = KafkaSharedStreamTrigger(["orders"], match="value.a", max_in_flight=50, max_payload_bytes=100)
    other = KafkaSharedStreamTrigger(["orders"], match="value.b")
    assert base.watcher_digest() == tuned.watcher_digest()
    assert base.watcher_digest() != other.watcher_digest()
    assert (
        KafkaSharedStreamTrigger(["a", "b"]).watcher_digest()
        == KafkaSharedStreamTrigger(["b", "a"]).watcher_digest()
    )
    assert watcher_group_id("g", base.watcher_digest()).startswith("g.watcher-")


def test_a_watcher_skips_only_records_below_its_own_position():
    watchers = StreamWatchers()
    cursor = watchers.join("d", "trigger 1")
    assert not cursor.passed(_message(0))  # not admitted yet: nothing is skipped
    cursor.next[TP] = 5
    assert cursor.passed(_message(4))
    assert not cursor.passed(_message(5))
    assert not cursor.passed(_message(0, partition=1))  # no position there: evaluated


def test_watchers_join_once_per_identity_and_are_admitted_again_after_the_producer_goes():
    watchers = StreamWatchers()
    first = watchers.join("d", "trigger 1")
    assert watchers.join("d", "trigger 1") is first
    assert watchers.take_pending() == [first]
    first.since_seq = 0
    assert watchers.admitted() == [first]
    watchers.readmit_all()
    assert watchers.admitted() == []
    assert watchers.pending == [first]


async def test_each_triggerer_scope_has_its_own_registry():
    outside = watchers_of(("t",))

    async def in_another_triggerer() -> StreamWatchers:
        triggerer_scope.set({})
        return watchers_of(("t",))

    inside = await asyncio.create_task(in_another_triggerer())
    assert inside is not outside
    assert watchers_of(("t",)) is outside


async def test_a_commit_cancelled_mid_request_is_sent_by_the_final_flush():
    sent: list[dict] = []
    started = asyncio.Event()

    async def commit(offsets):
        if not sent and not started.is_set():
            started.set()
            await asyncio.sleep(3600)  # the broker is slow: stop() cancels this request
        sent.append(dict(offsets))

    committer = OffsetCommitter(
        commit=commit,
        describe_error=lambda what, exc: KafkaSharedStreamError(what),
    )
    committer.start()
    committer.queue(TP, 4)
    await asyncio.wait_for(started.wait(), 5)
    await committer.stop()
    assert sent == [{TP: 4}]


@pytest.mark.parametrize("offset", [0, 3])
def test_passed_is_false_for_a_watcher_without_positions(offset):
    assert not StreamWatchers().join("x", "t").passed(_message(offset))
