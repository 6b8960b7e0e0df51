"""The stream's memory of topic ids and the commit guard, without a broker (fake cluster and stores)."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from aiokafka import TopicPartition

from airflow_shared_stream.kafka import commit_guard, topic_memory
from airflow_shared_stream.kafka.cluster_watch import ClusterWatch
from airflow_shared_stream.kafka.commit_guard import CommitGuard
from airflow_shared_stream.kafka.errors import KafkaSharedStreamError
from airflow_shared_stream.kafka.topic_ids import TopicShape
from airflow_shared_stream.kafka.topic_memory import TopicMemory, memory_key
from airflow_shared_stream.kafka.watcher_positions import WatcherPositions
from airflow_shared_stream.kafka.watchers import StreamWatchers
from airflow_shared_stream.testing import InMemoryStateStore

TP = TopicPartition("orders", 0)


class SlowStore(InMemoryStateStore):
    """A store whose reads hang (a supervisor that does not answer)."""

    async def aget(self, key: str, default: Any = None) -> Any:
        await asyncio.Event().wait()


def _memory(store: Any, topics: tuple[str, ...] = ("orders",)) -> TopicMemory:
    watchers = StreamWatchers()
    watchers.carriers[1] = ("digest", store)
    return TopicMemory(watchers, list(topics))


def _cluster(topic_id: str) -> ClusterWatch:
    cluster = ClusterWatch(["orders"], interval=60.0)
    cluster.shapes = {"orders": TopicShape(topic_id, 1)}
    return cluster


async def test_a_remembered_id_that_differs_takes_the_topic_for_created_again(caplog):
    store = InMemoryStateStore()
    store.set(memory_key("digest"), {"topics": {"orders": "aa"}})
    cluster = _cluster("bb")
    memory = _memory(store)
    with caplog.at_level(logging.WARNING):
        await memory.start(cluster, consumer=None)  # type: ignore[arg-type]
    assert memory.ready.is_set()
    assert "orders" in cluster.gone
    assert cluster.due()
    assert any("is not the log this stream last committed" in r.getMessage() for r in caplog.records)
    await memory.aclose()


async def test_an_id_that_is_not_text_is_left_out_never_taken_for_a_new_topic():
    """A memory someone else wrote (``null``, a number): the topic is not read again from its start."""
    store = InMemoryStateStore()
    store.set(memory_key("digest"), {"topics": {"orders": None, "other": 7}})
    cluster = _cluster("aa")
    memory = _memory(store)
    await memory.start(cluster, consumer=None)  # type: ignore[arg-type]
    assert memory.ready.is_set()
    assert "orders" not in cluster.gone
    assert not cluster.due()
    await memory.aclose()


async def test_the_same_id_changes_nothing_and_writes_nothing():
    store = InMemoryStateStore()
    store.set(memory_key("digest"), {"topics": {"orders": "aa"}})
    cluster = _cluster("aa")
    memory = _memory(store)
    await memory.start(cluster, consumer=None)  # type: ignore[arg-type]
    memory.committed_on({"orders": "aa"})
    await memory.aclose()
    assert not cluster.gone
    assert not cluster.due()
    assert store.writes == 1  # the test's own


class SupervisorsStore(InMemoryStateStore):
    """A store as a triggerer's watcher has one: Airflow's accessor, served by the supervisor."""


SupervisorsStore.__module__ = "airflow.sdk.execution_time.context"


async def test_the_supervisors_store_is_read_at_once_in_a_triggerer_that_just_started():
    """
    Issue 50: the memory waited 30 s after the triggerer's start before its first read through the
    supervisor (a guess at when a warm-up thread would have built the supervisor's Execution
    API), and its first write then made the supervisor wait for that thread. The supervisor now
    readies its API before the runner exists (``execution_api_warmup``): read at once.
    """
    store = SupervisorsStore()
    store.set(memory_key("digest"), {"topics": {"orders": "aa"}})
    cluster = _cluster("bb")
    memory = _memory(store)
    await memory.start(cluster, consumer=None)  # type: ignore[arg-type]
    assert "orders" in cluster.gone, "the memory was not read before the stream's first fetch"
    await memory.aclose()


async def test_a_new_id_committed_on_is_written_and_read_by_the_next_start():
    store = InMemoryStateStore()
    memory = _memory(store)
    await memory.start(_cluster("aa"), consumer=None)  # type: ignore[arg-type]
    memory.committed_on({"orders": "aa"})
    await memory.aclose()
    assert store.get(memory_key("digest")) == {"topics": {"orders": "aa"}, "generation": 1}


async def test_a_read_that_hangs_never_blocks_the_start_and_writes_nothing(monkeypatch):
    monkeypatch.setattr(topic_memory, "READ_TIMEOUT", 0.05)
    store = SlowStore()
    store.set(memory_key("digest"), {"topics": {"orders": "aa"}})
    memory = _memory(store)
    await memory.start(_cluster("bb"), consumer=None)  # type: ignore[arg-type]
    memory.committed_on({"orders": "bb"})
    await asyncio.sleep(0.1)
    await memory.aclose()
    assert store.get(memory_key("digest")) == {"topics": {"orders": "aa"}}  # kept for the next start


class FakeClient:
    def __init__(self, topic_id: str) -> None:
        self.topic_id = topic_id
        self.sent = 0


async def test_the_guard_withholds_a_topic_whose_id_changed(monkeypatch):
    client = FakeClient("bb")

    async def shapes(_client: Any, topics: list[str]) -> dict[str, TopicShape]:
        client.sent += 1
        await asyncio.sleep(0)
        return {"orders": TopicShape(client.topic_id, 1)}

    monkeypatch.setattr(commit_guard, "read_topic_shapes", shapes)
    cluster = _cluster("aa")
    guard = CommitGuard(cluster)
    guard.bind(client)
    assert await guard.admit({TP: 25}) == {}
    assert cluster.due()
    cluster.shapes = {"orders": TopicShape("bb", 1)}  # followed
    assert await guard.admit({TP: 0}) == {TP: 0}
    # Rounds that wait together share one read, never one that began before they came.
    results = await asyncio.gather(*(guard.admit({TP: n}) for n in range(5)))
    assert [r[TP] for r in results] == list(range(5))
    assert client.sent <= 4


def _no_error(what: str, exc: BaseException) -> KafkaSharedStreamError:
    return KafkaSharedStreamError(what)


def _positions(watchers: StreamWatchers) -> WatcherPositions:
    positions = WatcherPositions(watchers, topics=["orders"], shape={}, describe_error=_no_error)
    positions.lanes = [TP]
    return positions


async def test_new_logs_of_the_topics_id_are_given_back_and_what_does_not_parse_is_left_out():
    store = InMemoryStateStore()
    entry = {"topic": "orders", "partition": 0, "start": 3, "topic_id": "aa", "away": ["g"]}
    other_id = {**entry, "topic_id": "zz", "partition": 0, "away": ["h"]}
    store.set(
        memory_key("digest"),
        {"topics": {"orders": "aa"}, "new_logs": ["junk", {"topic": 1}, other_id, entry]},
    )
    watchers = StreamWatchers()
    watchers.carriers[1] = ("digest", store)
    positions = _positions(watchers)
    memory = TopicMemory(watchers, ["orders"], positions)
    await memory.start(_cluster("aa"), consumer=None)  # type: ignore[arg-type]
    assert positions.new_logs == {TP: (3, frozenset({"g"}))}
    await memory.aclose()


async def test_a_new_log_is_written_with_its_topic_id_and_dropped_when_no_watcher_is_away():
    store = InMemoryStateStore()
    store.set(memory_key("digest"), {"topics": {"orders": "aa"}})
    watchers = StreamWatchers()
    watchers.carriers[1] = ("digest", store)
    positions = _positions(watchers)
    memory = TopicMemory(watchers, ["orders"], positions)
    cluster = _cluster("aa")
    await memory.start(cluster, consumer=None)  # type: ignore[arg-type]
    cluster.shapes = {"orders": TopicShape("bb", 1)}  # followed a re-creation
    positions.restart_lanes({TP: 0})
    positions.new_logs[TP] = (0, frozenset({"g"}))
    assert not memory._due()  # not before the stream committed on the new id
    memory.committed_on({"orders": "bb"})
    await asyncio.wait_for(memory._flushed(), 5)
    written = store.get(memory_key("digest"))
    assert written["topics"] == {"orders": "bb"}
    assert written["new_logs"] == [
        {"topic": "orders", "partition": 0, "start": 0, "topic_id": "bb", "away": ["g"]}
    ]
    positions._no_longer_away("g")
    await memory.aclose()
    assert {k: v for k, v in store.get(memory_key("digest")).items() if k != "generation"} == {
        "topics": {"orders": "bb"}
    }


async def test_the_served_groups_kept_are_bounded_to_the_latest_admitted(monkeypatch):
    monkeypatch.setattr(topic_memory, "MAX_SERVED", 3)
    store = InMemoryStateStore()
    store.set(memory_key("digest"), {"topics": {"orders": "aa"}, "served": ["g0", "g1"]})
    watchers = StreamWatchers()
    watchers.carriers[1] = ("digest", store)
    positions = _positions(watchers)
    memory = TopicMemory(watchers, ["orders"], positions)
    await memory.start(_cluster("aa"), consumer=None)  # type: ignore[arg-type]
    assert positions.served == {"g0", "g1"}
    for group in ("g2", "g3"):
        positions.on_served(group)
    await memory.aclose()
    assert store.get(memory_key("digest"))["served"] == ["g1", "g2", "g3"]
