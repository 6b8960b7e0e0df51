"""
The triggerer side of the Streams page: figures fed by ``StreamMetrics.flush`` and written to a
watcher's asset state store at a bounded rate (pure logic; the state store is a recording fake,
the real one is exercised by tests/e2e/test_streams_page.py).
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from airflow_shared_stream.common import metrics as m
from airflow_shared_stream.common.metrics import StreamMetrics
from airflow_shared_stream.common.process_scope import triggerer_scope
from airflow_shared_stream.console import figures as f
from airflow_shared_stream.sqs.trigger import SqsSharedStreamTrigger

QUEUE = "https://sqs.us-east-1.amazonaws.com/000000000000/orders"


class RecordingStore:
    """Stands in for ``BaseEventTrigger.asset_state_store`` of a watcher of one asset."""

    def __init__(self) -> None:
        self.writes: list[tuple[str, Any]] = []

    async def aset(self, key: str, value: Any) -> None:
        self.writes.append((key, value))


async def until(condition: Any, what: str, timeout: float = 10.0) -> None:
    """Yield to the loop until ``condition()`` holds (the writes are tasks of the loop)."""
    deadline = asyncio.get_running_loop().time() + timeout
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.01)


@pytest.fixture(autouse=True)
def own_triggerer_scope() -> Any:
    token = triggerer_scope.set({})
    yield
    triggerer_scope.reset(token)


def _watcher(trigger_id: int, store: RecordingStore | None) -> SqsSharedStreamTrigger:
    trigger = SqsSharedStreamTrigger(queue_url=QUEUE, match="body.kind == 'x'")
    trigger.trigger_id = trigger_id
    trigger.asset_state_store = store  # type: ignore[assignment]
    return trigger


async def test_a_flush_is_published_to_the_watchers_asset_under_the_streams_key() -> None:
    store = RecordingStore()
    with f.stream_figures.watching(_watcher(1, store)):
        metrics = StreamMetrics("sqs", "orders", flush_interval=0.01)
        metrics.incr(m.RECEIVED, 3)
        metrics.incr(m.DEAD_LETTERED, 1)
        metrics.gauge(m.IN_FLIGHT, 2)
        metrics.flush()
        await until(
            lambda: bool(store.writes) and store.writes[-1][1]["totals"]["received"] == 3,
            "the flushed counts",
        )
    key, value = store.writes[-1]
    assert key == "shared_stream.figures.sqs.orders.1"
    assert value["totals"]["received"] == 3
    assert value["totals"]["dead_lettered"] == 1
    assert value["in_flight"] == 2
    assert value["last_received_at"] is not None
    assert value["history"][-1][1:] == [3, 1, 2]


async def test_the_lag_a_producer_notes_is_written_with_the_next_flush(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("AIRFLOW__SHARED_STREAM__FIGURES_PUBLISH_INTERVAL", "0.1")
    store = RecordingStore()
    with f.stream_figures.watching(_watcher(1, store)):
        await until(lambda: bool(store.writes), "the first write")
        f.stream_figures.set_lag("sqs", "orders", {"trigger 1": {"orders/0": 4}})
        metrics = StreamMetrics("sqs", "orders", flush_interval=0.01)
        metrics.gauge(m.IN_FLIGHT, 1)
        metrics.flush()
        await until(lambda: store.writes[-1][1]["in_flight"] == 1, "the flush after the lag")
    assert store.writes[-1][1]["lag"] == {"trigger 1": {"orders/0": 4}}


async def test_writes_are_bounded_and_the_last_change_still_lands(monkeypatch: pytest.MonkeyPatch) -> None:
    """Flushes within one interval make no write of their own, and one write when it ends."""
    monkeypatch.setenv("AIRFLOW__SHARED_STREAM__FIGURES_PUBLISH_INTERVAL", "0.5")
    store = RecordingStore()
    with f.stream_figures.watching(_watcher(1, store)):
        await until(lambda: len(store.writes) == 1, "the watcher's first write")
        for _ in range(20):  # no await in between: as many flushes as fit in one instant
            f.stream_figures.absorb("sqs", "orders", {m.RECEIVED: 1}, {})
        await until(lambda: store.writes[-1][1]["totals"]["received"] == 20, "the last change")
        await asyncio.sleep(0.6)  # one more interval: nothing else is due
    assert len(store.writes) == 2


async def test_a_hung_state_store_holds_one_write_and_never_the_stream() -> None:
    """A supervisor that never answers: one write waits, the stream keeps counting."""

    class Hung(RecordingStore):
        async def aset(self, key: str, value: Any) -> None:
            self.writes.append((key, value))
            await asyncio.Event().wait()

    store = Hung()
    with f.stream_figures.watching(_watcher(1, store)):
        await until(lambda: len(store.writes) == 1, "the first write")
        figures = f.stream_figures.streams[("sqs", "orders")]
        figures.published_at = 0.0
        for _ in range(5):
            f.stream_figures.absorb("sqs", "orders", {m.RECEIVED: 1}, {})
            await asyncio.sleep(0.01)
        assert len(store.writes) == 1
        assert figures.totals[m.RECEIVED] == 5
        assert figures.writing is not None
        figures.writing.cancel()


async def test_a_watcher_without_a_state_store_carries_nothing_and_the_stream_still_counts() -> None:
    with f.stream_figures.watching(_watcher(1, None)):
        f.stream_figures.absorb("sqs", "orders", {m.RECEIVED: 2}, {})
    assert f.stream_figures.streams[("sqs", "orders")].totals[m.RECEIVED] == 2
    assert f.stream_figures.streams[("sqs", "orders")].carriers == {}


async def test_a_failing_state_store_never_reaches_the_stream() -> None:
    class Failing(RecordingStore):
        async def aset(self, key: str, value: Any) -> None:
            raise ConnectionError("supervisor gone")

    with f.stream_figures.watching(_watcher(1, Failing())):
        f.stream_figures.absorb("sqs", "orders", {m.RECEIVED: 1}, {})
        await asyncio.sleep(0)
    assert f.stream_figures.streams[("sqs", "orders")].totals[m.RECEIVED] == 1


async def test_the_published_value_holds_counts_and_names_only() -> None:
    store = RecordingStore()
    with f.stream_figures.watching(_watcher(1, store)):
        await until(lambda: bool(store.writes), "the first write")
    assert set(store.writes[-1][1]) == {
        "broker",
        "stream",
        "carrier_trigger_id",
        "published_at",
        "last_received_at",
        "totals",
        "in_flight",
        "history",
        "lag",
    }


async def test_the_watcher_with_the_lowest_trigger_id_carries_the_figures() -> None:
    """A triggerer that takes a stream over writes the key its predecessor wrote, not a second one."""
    first, second = RecordingStore(), RecordingStore()
    with f.stream_figures.watching(_watcher(9, second)), f.stream_figures.watching(_watcher(4, first)):
        figures = f.stream_figures.streams[("sqs", "orders")]
        await until(lambda: figures.writing is not None and figures.writing.done(), "the first write")
        figures.published_at = 0.0
        f.stream_figures.absorb("sqs", "orders", {m.RECEIVED: 1}, {})
        await until(lambda: bool(first.writes) and first.writes[-1][1]["totals"]["received"] == 1, "a write")
    assert first.writes[-1][0] == "shared_stream.figures.sqs.orders.4"
    assert first.writes[-1][1]["totals"]["received"] == 1


async def test_an_interval_of_zero_turns_the_writes_off(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AIRFLOW__SHARED_STREAM__FIGURES_PUBLISH_INTERVAL", "0")
    store = RecordingStore()
    with f.stream_figures.watching(_watcher(1, store)):
        f.stream_figures.absorb("sqs", "orders", {m.RECEIVED: 1}, {})
        await asyncio.sleep(0.05)
    assert store.writes == []
    assert f.stream_figures.streams[("sqs", "orders")].totals[m.RECEIVED] == 1
