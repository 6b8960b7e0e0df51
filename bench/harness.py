"""
The harness core of bench/watchers.py: a cell, its meter, and the runs through Airflow's real
``SharedStreamManager`` (shared streams, the in-flight hold, independent pollers).
"""

from __future__ import annotations

import asyncio
import gc
import json
import os
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from airflow.sdk.module_loading import import_string
from airflow.triggers.shared_stream import SharedStreamManager

from bench.machine import Settled, processes_cpu_seconds

ROOT = Path(__file__).resolve().parents[1]
IN_FLIGHT_WATCHERS = 10
"""Watchers of the ``in-flight`` hold (memory per in-flight trigger event)."""


@dataclass
class Cell:
    broker: str
    variant: str
    watchers: int
    messages: int
    delivered: int = 0
    """Trigger events fired, summed over the watchers."""
    seconds: float = 0.0
    cpu_seconds: float = 0.0
    rss_growth_kib: float = 0.0
    requests: dict[str, int] = field(default_factory=dict)
    load: float = 0.0
    error: str | None = None
    heap_per_event_bytes: float | None = None
    """``in-flight`` hold only: Python heap (tracemalloc) growth per in-flight trigger event."""
    repeats: list[float] = field(default_factory=list)
    """With ``--repeats``: messages/s of every repeat of this variant and N (this cell is the median)."""
    settled: Settled | None = None
    """How long the broker took to go quiet before this cell (:func:`bench.machine.wait_until_idle`)."""
    broker_cpu_seconds: float | None = None
    """CPU the broker's processes spent while the cell was timed (``None``: not measured)."""
    run: str | None = None
    """The run that measured this cell (its table's ``run:`` line, UTC), kept through ``--update``:
    a table whose cells come from two runs names the later run in each re-measured row."""

    @property
    def fanout(self) -> int:
        """Trigger events per message: one per watcher, none fanned out by the bare loop."""
        return 1 if self.variant == "bare" else self.watchers

    @property
    def messages_per_second(self) -> float:
        return self.delivered / self.fanout / self.seconds if self.seconds > 0 else 0.0

    @property
    def events_per_second(self) -> float:
        return self.delivered / self.seconds if self.seconds > 0 else 0.0

    @property
    def cpu_per_1000(self) -> float:
        done = self.delivered / self.fanout
        return self.cpu_seconds / done * 1000 if done else float("nan")

    @property
    def broker_cpu_per_1000(self) -> float | None:
        done = self.delivered / self.fanout
        if self.broker_cpu_seconds is None or not done:
            return None
        return self.broker_cpu_seconds / done * 1000

    @property
    def requests_per_message(self) -> float | None:
        if not self.requests:
            return None
        done = self.delivered / self.fanout
        return sum(self.requests.values()) / done if done else None

    def as_row(self) -> dict[str, Any]:
        return {
            **asdict(self),
            "messages_per_second": self.messages_per_second,
            "events_per_second": self.events_per_second,
            "cpu_per_1000": self.cpu_per_1000,
            "broker_cpu_per_1000": self.broker_cpu_per_1000,
            "requests_per_message": self.requests_per_message,
        }


def rss_kib() -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


class Meter:
    """
    CPU seconds of this process (minus the proxy's thread), RSS, wall time, requests, for one cell.

    ``proxy`` is whatever counts the broker requests: ``reset()``, ``counts()`` and
    ``cpu_seconds()`` (CPU this process spent counting, which is not the triggerer's).

    The broker's own CPU over the same span is measured too (:attr:`broker_pids`). It is not the
    triggerer's cost, but here the broker runs on the same two cores: a cell whose broker burns
    a core has one core left for the triggerer, which a deployment talking to a remote broker
    would not lose, and a ceiling that talks to no broker never pays it.
    """

    broker_pids: ClassVar[tuple[int, ...]] = ()
    """Processes of the broker under test (set per broker by :func:`bench`); none: not measured."""

    def __init__(self, proxy: Any | None) -> None:
        self.proxy = proxy
        self._broker_cpu0: float | None = None

    def _cpu(self) -> float:
        return time.process_time() - (self.proxy.cpu_seconds() if self.proxy else 0.0)

    def start(self) -> None:
        if self.proxy:
            self.proxy.reset()
        self._rss = rss_kib()
        self._cpu0 = self._cpu()

    def first_event(self) -> None:
        # Before the stamps: reading the broker's process tree is not the cell's to pay for.
        if self.broker_pids:
            self._broker_cpu0 = processes_cpu_seconds(self.broker_pids)
        self._wall0 = time.perf_counter()
        self._cpu_at_first = self._cpu()

    def stop(self, cell: Cell, watchers_alive_rss: int) -> None:
        cell.seconds = time.perf_counter() - getattr(self, "_wall0", time.perf_counter())
        cell.cpu_seconds = self._cpu() - getattr(self, "_cpu_at_first", self._cpu0)
        if self._broker_cpu0 is not None:
            cell.broker_cpu_seconds = processes_cpu_seconds(self.broker_pids) - self._broker_cpu0
        cell.rss_growth_kib = (watchers_alive_rss - self._rss) / cell.fanout
        cell.requests = dict(self.proxy.counts()) if self.proxy else {}
        cell.load = os.getloadavg()[0]


def _rebuild(trigger: Any) -> Any:
    """As the triggerer does: the trigger it runs is built from ``serialize()``."""
    classpath, kwargs = trigger.serialize()
    return import_string(classpath)(**json.loads(json.dumps(kwargs)))


async def drive_shared(
    make_trigger: Callable[[], Any],
    cell: Cell,
    meter: Meter,
    budget: float,
    sync: float,
    at_peak: Callable[[], None] | None = None,
) -> None:
    """Run ``cell.watchers`` watchers through a fresh manager until each fired ``messages`` times."""
    manager = SharedStreamManager(cohort_grace_period=0.5)
    meter.start()
    triggers = [_rebuild(make_trigger()) for _ in range(cell.watchers)]
    producers = _capture_producers(type(triggers[0]))
    key = triggers[0].shared_stream_key()
    counts = [0] * cell.watchers
    finished = [0]
    done = asyncio.Event()
    unconfirmed: list[int] = []
    errors: list[str] = []
    first: list[bool] = []

    async def watcher(index: int, trigger: Any) -> None:
        stream = manager.subscribe(trigger_id=index, trigger=trigger, key=key)
        try:
            async for _event in trigger.filter_shared_stream(stream):
                await asyncio.sleep(0)  # the runner awaits a log call before binding
                seq = manager.bind_pending_event(trigger_id=index, key=key)
                if seq is not None:
                    if sync <= 0:
                        manager.confirm_persisted((seq,))
                    else:
                        unconfirmed.append(seq)
                if not first:
                    first.append(True)
                    meter.first_event()
                counts[index] += 1
                if counts[index] == cell.messages:
                    finished[0] += 1  # not all(counts): O(N) per event would bill the harness at N=1,000
                    if finished[0] == cell.watchers:
                        done.set()
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            errors.append(f"{type(exc).__name__}: {exc}")
            done.set()
        finally:
            await manager.unsubscribe(index, key)

    async def supervisor() -> None:
        while True:
            await asyncio.sleep(sync)
            batch, unconfirmed[:] = list(unconfirmed), []
            manager.confirm_persisted(batch)

    tasks = [asyncio.create_task(watcher(i, t)) for i, t in enumerate(triggers)]
    if sync > 0:
        tasks.append(asyncio.create_task(supervisor()))
    started = time.monotonic()
    try:
        await asyncio.wait_for(done.wait(), budget)
    except TimeoutError:
        errors.append(f"budget of {budget:.0f}s spent: {min(counts)}/{cell.messages} at the slowest watcher")
    if at_peak is not None:
        at_peak()
    elif not errors:
        # The cell ends when its messages are settled on the broker, as the bare loop's does: the
        # requests counted then include every ACK, and the rate pays for them.
        await _settled(producers.made, deadline=started + budget)
    producers.restore()
    cell.delivered = sum(min(c, cell.messages) for c in counts)
    alive_rss = rss_kib()
    meter.stop(cell, alive_rss)
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    await manager.stop_all()
    cell.error = "; ".join(errors[:1]) or None


class _ProducerCapture:
    """Keep the producers a trigger class builds (the manager keeps its producer to itself)."""

    def __init__(self, trigger_class: type) -> None:
        self.trigger_class = trigger_class
        self.made: list[Any] = []
        self._own = "create_shared_stream_producer" in trigger_class.__dict__
        self._original = trigger_class.__dict__.get("create_shared_stream_producer")
        factory = trigger_class.create_shared_stream_producer  # bound classmethod
        made = self.made

        def capture(cls: type, kwargs: dict[str, Any]) -> Any:
            producer = factory.__func__(cls, kwargs)
            made.append(producer)
            return producer

        trigger_class.create_shared_stream_producer = classmethod(capture)  # type: ignore[attr-defined]

    def restore(self) -> None:
        if self._own:
            self.trigger_class.create_shared_stream_producer = self._original  # type: ignore[attr-defined]
        else:
            del self.trigger_class.create_shared_stream_producer  # type: ignore[attr-defined]


def _capture_producers(trigger_class: type) -> _ProducerCapture:
    return _ProducerCapture(trigger_class)


async def _settled(producers: list[Any], deadline: float) -> None:
    """
    Until every leased-queue producer has settled all it received on the broker.

    Nothing in flight, nothing queued for ACK, and nothing still held: a message leaves the
    held set only once its settlement call returned (an ACK batch on the wire is still held).
    """
    while time.monotonic() < deadline:
        pending = [
            p
            for p in producers
            if hasattr(p, "held_deliveries") and (p.in_flight or len(p._acks) or p.held_deliveries())
        ]
        if not pending:
            return
        await asyncio.sleep(0.005)


async def hold_in_flight(make_trigger: Callable[[], Any], cell: Cell, budget: float) -> None:
    """
    ``cell.watchers`` watchers take ``cell.messages`` (one credit window) that are never persisted.

    Nothing is confirmed, so every message stays in flight with one unconfirmed trigger event per
    watcher; the growth of the Python heap (tracemalloc) and of RSS at that peak is divided by
    those events. The stream is then closed unsettled: the broker gets the messages back.
    """
    import tracemalloc

    gc.collect()  # again, after the cell's set-up: the heap's baseline holds no garbage
    tracemalloc.start()
    heap0 = tracemalloc.get_traced_memory()[0]
    peak: dict[str, int] = {}

    def at_peak() -> None:
        peak["heap"] = tracemalloc.get_traced_memory()[0]

    try:
        await drive_shared(make_trigger, cell, Meter(None), budget, sync=HOLD_SECONDS, at_peak=at_peak)
    finally:
        tracemalloc.stop()
    events = cell.delivered or 1
    cell.heap_per_event_bytes = (peak.get("heap", heap0) - heap0) / events
    cell.rss_growth_kib = cell.rss_growth_kib * cell.fanout / events


HOLD_SECONDS = 10.0**6
"""Persistence "interval" of the in-flight hold: never, within a cell."""


async def run_pollers(
    cell: Cell,
    meter: Meter,
    budget: float,
    makers: list[Callable[[], Any]],
    messages_in: Callable[[Any], int],
) -> None:
    """One independent trigger per watcher, rebuilt from ``serialize()`` and re-run after each event."""
    meter.start()
    meter.first_event()
    counts = [0] * len(makers)

    async def poller(index: int, make: Callable[[], Any]) -> None:
        while counts[index] < cell.messages:
            trigger = _rebuild(make())
            async for event in trigger.run():
                counts[index] += messages_in(event)
                break

    tasks = [asyncio.create_task(poller(i, make)) for i, make in enumerate(makers)]
    try:
        await asyncio.wait_for(asyncio.gather(*tasks), budget)
    except TimeoutError:
        cell.error = f"budget of {budget:.0f}s spent: {min(counts)}/{cell.messages} at the slowest watcher"
    except Exception as exc:
        cell.error = f"{type(exc).__name__}: {exc}"[:200]
    cell.delivered = sum(min(c, cell.messages) for c in counts)
    meter.stop(cell, rss_kib())
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


def median_cell(cells: list[Cell]) -> Cell:
    """
    The repeat with the median messages/s (the lower middle one of an even count), with every
    repeat's rate kept on it: on a shared two-core machine one cell can run at half the speed of
    the next, and a single run compares whatever the neighbours were doing.
    """
    ranked = sorted(cells, key=lambda c: c.messages_per_second)
    chosen = ranked[(len(ranked) - 1) // 2]
    if len(cells) > 1:
        chosen.repeats = [round(c.messages_per_second, 1) for c in cells]
    return chosen
