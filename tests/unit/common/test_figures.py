"""
The triggerer side of the Streams page: figures fed by ``StreamMetrics.flush`` and written to a
watcher's asset state store at a bounded rate (pure logic; the state store is a recording fake,
the real one is exercised by tests/e2e/test_streams_page.py).
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from airflow_shared_stream.common import figures as f
from airflow_shared_stream.common import metrics as m
from airflow_shared_stream.common.metrics import StreamMetrics
from airflow_shared_stream.common.process_scope import triggerer_scope
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


def _watcher(trigger_id: int, store: RecordingStore | None, queue_url: str = QUEUE) -> SqsSharedStreamTrigger:
    trigger = SqsSharedStreamTrigger(queue_url=queue_url, match="body.kind == 'x'")
    trigger.trigger_id = trigger_id
    trigger.asset_state_store = store  # type: ignore[assignment]
    return trigger


STREAM_ID = f.figures_stream_id(_watcher(0, None).shared_stream_key())


def _metrics(flush_interval: float = 0.01, queue_url: str = QUEUE) -> StreamMetrics:
    """The metrics of the stream, as its producer's are when the triggerer builds it."""
    key = _watcher(0, None, queue_url).shared_stream_key()
    return StreamMetrics("sqs", "orders", flush_interval=flush_interval, stream_id=f.figures_stream_id(key))


async def test_a_flush_is_published_to_the_watchers_asset_under_the_streams_key() -> None:
    store = RecordingStore()
    with f.stream_figures.watching(_watcher(1, store)):
        metrics = _metrics()
        metrics.incr(m.RECEIVED, 3)
        metrics.incr(m.DEAD_LETTERED, 1)
        metrics.gauge(m.IN_FLIGHT, 2)
        metrics.flush()
        await until(
            lambda: bool(store.writes) and store.writes[-1][1]["totals"]["received"] == 3,
            "the flushed counts",
        )
    key, value = store.writes[-1]
    assert key == f"shared_stream.figures.sqs.{STREAM_ID}.1"
    assert (value["stream"], value["stream_id"]) == ("orders", STREAM_ID)
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
        metrics = _metrics()
        f.stream_figures.set_lag(metrics, {"trigger 1": {"orders/0": 4}})
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
            f.stream_figures.absorb(_metrics(), {m.RECEIVED: 1}, {})
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
        figures = f.stream_figures.streams[STREAM_ID]
        figures.published_at = 0.0
        for _ in range(5):
            f.stream_figures.absorb(_metrics(), {m.RECEIVED: 1}, {})
            await asyncio.sleep(0.01)
        assert len(store.writes) == 1
        assert figures.totals[m.RECEIVED] == 5
        assert figures.writing is not None
        figures.writing.cancel()


async def test_a_watcher_without_a_state_store_carries_nothing_and_the_stream_still_counts() -> None:
    with f.stream_figures.watching(_watcher(1, None)):
        f.stream_figures.absorb(_metrics(), {m.RECEIVED: 2}, {})
    assert f.stream_figures.streams[STREAM_ID].totals[m.RECEIVED] == 2
    assert f.stream_figures.streams[STREAM_ID].carriers == {}


async def test_a_failing_state_store_never_reaches_the_stream() -> None:
    class Failing(RecordingStore):
        async def aset(self, key: str, value: Any) -> None:
            raise ConnectionError("supervisor gone")

    with f.stream_figures.watching(_watcher(1, Failing())):
        f.stream_figures.absorb(_metrics(), {m.RECEIVED: 1}, {})
        await asyncio.sleep(0)
    assert f.stream_figures.streams[STREAM_ID].totals[m.RECEIVED] == 1


async def test_the_published_value_holds_counts_and_names_only() -> None:
    store = RecordingStore()
    with f.stream_figures.watching(_watcher(1, store)):
        await until(lambda: bool(store.writes), "the first write")
    assert set(store.writes[-1][1]) == {
        "broker",
        "stream",
        "stream_id",
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
        figures = f.stream_figures.streams[STREAM_ID]
        await until(lambda: figures.writing is not None and figures.writing.done(), "the first write")
        figures.published_at = 0.0
        f.stream_figures.absorb(_metrics(), {m.RECEIVED: 1}, {})
        await until(lambda: bool(first.writes) and first.writes[-1][1]["totals"]["received"] == 1, "a write")
    assert first.writes[-1][0] == f"shared_stream.figures.sqs.{STREAM_ID}.4"
    assert first.writes[-1][1]["totals"]["received"] == 1


async def test_an_interval_of_zero_turns_the_writes_off(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AIRFLOW__SHARED_STREAM__FIGURES_PUBLISH_INTERVAL", "0")
    store = RecordingStore()
    with f.stream_figures.watching(_watcher(1, store)):
        f.stream_figures.absorb(_metrics(), {m.RECEIVED: 1}, {})
        await asyncio.sleep(0.05)
    assert store.writes == []
    assert f.stream_figures.streams[STREAM_ID].totals[m.RECEIVED] == 1


async def test_two_streams_with_one_label_keep_and_write_their_own_figures() -> None:
    """Issue 45 item 13: queue ``orders`` of two accounts in one triggerer: one label, two streams."""
    other = QUEUE.replace("000000000000", "111111111111")
    here, there = RecordingStore(), RecordingStore()
    with f.stream_figures.watching(_watcher(1, here)), f.stream_figures.watching(_watcher(2, there, other)):
        await until(lambda: bool(here.writes) and bool(there.writes), "each stream's first write")
        for stream in f.stream_figures.streams.values():
            stream.published_at = 0.0
        f.stream_figures.absorb(_metrics(queue_url=other), {m.RECEIVED: 25}, {})
        await until(lambda: there.writes[-1][1]["totals"]["received"] == 25, "the other stream's write")
    other_id = f.figures_stream_id(_watcher(0, None, other).shared_stream_key())
    assert other_id != STREAM_ID
    assert there.writes[-1][0] == f"shared_stream.figures.sqs.{other_id}.2"
    assert {w[1]["totals"]["received"] for w in here.writes} == {0}
    assert {w[1]["stream"] for w in here.writes + there.writes} == {"orders"}


async def test_metrics_that_name_no_stream_keep_no_figures() -> None:
    StreamMetrics("sqs", "orders").incr(m.RECEIVED, 1)  # a redrive's, a placement gauge's
    assert f.stream_figures.streams == {}


def test_a_trigger_of_two_assets_writes_through_one_of_them() -> None:
    """Issue 45 item 14: Airflow's accessors of two watched assets refuse a bare ``aset``."""
    from airflow.sdk import Asset
    from airflow.sdk.execution_time.context import AssetStateStoreAccessors

    store = AssetStateStoreAccessors(
        inlets=[Asset(name="orders-b", uri="s3://b"), Asset(name="orders-a", uri="s3://a")]
    )
    with pytest.raises(ValueError, match="2 concrete inlets"):
        store._single_accessor()
    assert f.one_asset_writer(store) is store[Asset(name="orders-a", uri="s3://a")]
    single = AssetStateStoreAccessors(inlets=[Asset(name="orders-a", uri="s3://a")])
    assert f.one_asset_writer(single) is single


async def test_a_watcher_of_two_assets_carries_its_streams_figures(monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 45 item 14, in the triggerer: the figures land on one asset's accessor, every time."""
    from airflow.sdk import Asset
    from airflow.sdk.execution_time import context
    from airflow.sdk.execution_time.context import AssetStateStoreAccessors

    written: list[tuple[str | None, str]] = []

    async def record(self: context.AssetStateStoreAccessor, key: str, value: Any) -> None:
        written.append((self._name, key))  # the supervisor's channel is not there in a unit test

    monkeypatch.setattr(context.AssetStateStoreAccessor, "aset", record)
    store = AssetStateStoreAccessors(
        inlets=[Asset(name="orders-b", uri="s3://b"), Asset(name="orders-a", uri="s3://a")]
    )
    with f.stream_figures.watching(_watcher(3, store)):  # type: ignore[arg-type]
        await until(lambda: bool(written), "the first write")
        f.stream_figures.streams[STREAM_ID].published_at = 0.0
        f.stream_figures.absorb(_metrics(), {m.RECEIVED: 1}, {})
        await until(lambda: len(written) == 2, "the write after a flush")
    assert written == [("orders-a", f"shared_stream.figures.sqs.{STREAM_ID}.3")] * 2


async def test_a_first_write_through_the_supervisor_goes_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """
    Issue 50: a stream's first figures write through Airflow's accessors (the triggerer's
    supervisor) waited 30 s after its first watcher started, a guess at when a warm-up thread
    would have built the supervisor's Execution API; the supervisor then waited for that thread
    on its main thread (30.3 s, "deadlocked"). The API is ready before the runner exists now.
    """
    from airflow.sdk import Asset
    from airflow.sdk.execution_time import context
    from airflow.sdk.execution_time.context import AssetStateStoreAccessors

    written: list[str] = []

    async def record(self: context.AssetStateStoreAccessor, key: str, value: Any) -> None:
        written.append(key)

    monkeypatch.setattr(context.AssetStateStoreAccessor, "aset", record)
    store = AssetStateStoreAccessors(inlets=[Asset(name="orders-a", uri="s3://a")])
    with f.stream_figures.watching(_watcher(5, store)):  # type: ignore[arg-type]
        await until(lambda: bool(written), "the first write through the supervisor")
    assert written == [f"shared_stream.figures.sqs.{STREAM_ID}.5"]


def test_every_spelling_of_one_queue_is_one_stream_in_the_figures() -> None:
    """FAULT_MODEL class 1: the figures' stream id follows the stream key, not how it is spelled."""
    shouted = QUEUE.replace("sqs.us-east-1", "SQS.US-EAST-1")
    assert f.figures_stream_id(_watcher(0, None, shouted).shared_stream_key()) == STREAM_ID


async def test_a_watcher_that_joins_a_running_stream_writes_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """
    A triggerer that takes a watcher over writes as it starts, though its interval has not passed:
    its value is then newer than what a dead triggerer left under that watcher's key (issue 45 item 12).
    """
    monkeypatch.setenv("AIRFLOW__SHARED_STREAM__FIGURES_PUBLISH_INTERVAL", "3600")
    store = RecordingStore()
    with f.stream_figures.watching(_watcher(4, store)):
        await until(lambda: len(store.writes) == 1, "the first watcher's write")
        await until(lambda: f.stream_figures.streams[STREAM_ID].writing.done(), "the write done")  # type: ignore[union-attr]
        with f.stream_figures.watching(_watcher(9, RecordingStore())):
            await until(lambda: len(store.writes) == 2, "a write as the second watcher starts")
    assert [key for key, _ in store.writes] == [f"shared_stream.figures.sqs.{STREAM_ID}.4"] * 2
