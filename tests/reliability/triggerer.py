"""
A triggerer with a persistence stub: the process the reliability scenarios kill, slow down and hang.

It runs watchers' triggers through Airflow's real ``SharedStreamManager``
(:class:`~airflow_shared_stream.testing.SharedStreamHarness`) and plays the supervisor the way
Airflow's does: every ``sync_interval`` seconds it persists the trigger events bound since the
last cycle (appends them to ``persisted.jsonl`` and flushes) and only THEN confirms them to the
manager, so a message can be settled on the broker only after its events are on disk. Every bound
event is also appended to ``bound.jsonl`` at once: after a SIGKILL, an event in ``bound`` but not
in ``persisted`` was received and never confirmed, so its message was still in flight (leased,
uncommitted) at the kill. That is how the scenarios prove a kill landed mid-flight.

The same code runs in the test process (most scenarios) and in a child process
(``python -m tests.reliability.triggerer <spec.json>``) for the SIGKILL scenario.

Watcher behaviours, applied between the filter's yield and the binding (where the manager sees a
subscriber that has not finished the event): ``normal``; ``slow`` (``delay`` seconds per event);
``hang`` (hangs forever on its first event, as a stuck filter does: Airflow's ack timeout fails
the subscriber but cannot cancel it, core limit 4).

A watcher that fails (its producer failed because the broker went away, say) is started again
after ``restart_after`` seconds, as the triggerer re-runs a trigger still assigned to it, and
the watchers that failed together are started again together, as the triggerer re-creates them
in one pass; each failure is recorded in ``errors.jsonl``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from airflow.sdk.module_loading import import_string
from airflow.triggers.base import TriggerEvent

from airflow_shared_stream.testing import SharedStreamHarness, Watcher

BOUND = "bound.jsonl"
PERSISTED = "persisted.jsonl"
ERRORS = "errors.jsonl"


@dataclass
class WatcherSpec:
    """One watcher: its name in the records, its trigger as ``serialize()`` gives it, its behaviour."""

    name: str
    classpath: str
    kwargs: dict[str, Any]
    behaviour: str = "normal"
    delay: float = 0.0

    def trigger(self) -> Any:
        return import_string(self.classpath)(**self.kwargs)


@dataclass
class TriggererSpec:
    """Everything a triggerer run needs; JSON-able, so a child process gets it as a file."""

    out_dir: str
    watchers: list[WatcherSpec]
    incarnation: int = 1
    sync_interval: float = 1.0
    persist_delay: float = 0.0
    """Seconds an event waits after binding before a cycle may persist it (a slow database)."""
    ack_timeout: float = 300.0
    restart_after: float = 0.5

    def dump(self, path: Path) -> None:
        path.write_text(json.dumps(asdict(self)))

    @classmethod
    def load(cls, path: Path) -> TriggererSpec:
        raw = json.loads(path.read_text())
        raw["watchers"] = [WatcherSpec(**w) for w in raw["watchers"]]
        return cls(**raw)


def message_number(event: TriggerEvent) -> int:
    """The scenario's number of the message behind an event (every body is ``{"n": ...}``)."""
    payload = event.payload
    body = payload.get("body", payload.get("value"))
    return int(body["n"])


@dataclass
class _Pending:
    seq: int | None
    due: float
    line: str


@dataclass
class PersistingTriggerer:
    """Run the watchers of ``spec`` until cancelled; see the module docstring."""

    spec: TriggererSpec
    harness: SharedStreamHarness = field(init=False)
    failures: int = 0
    _pending: list[_Pending] = field(default_factory=list)
    _by_watcher: dict[int, WatcherSpec] = field(default_factory=dict)
    _tasks: list[asyncio.Task[None]] = field(default_factory=list)
    _persisting: asyncio.Event = field(default_factory=asyncio.Event)

    def __post_init__(self) -> None:
        self._persisting.set()
        out = Path(self.spec.out_dir)
        out.mkdir(parents=True, exist_ok=True)
        # Line-buffered text files: each line reaches the kernel when written, so it survives a
        # SIGKILL of this process (not a machine crash, which these scenarios do not simulate).
        self._bound = open(out / BOUND, "a", buffering=1)  # noqa: SIM115 - closed in stop()
        self._persisted = open(out / PERSISTED, "a", buffering=1)  # noqa: SIM115
        self._errors = open(out / ERRORS, "a", buffering=1)  # noqa: SIM115
        self.harness = SharedStreamHarness(
            confirm_after=None, ack_timeout=self.spec.ack_timeout, on_bound=self._on_bound
        )

    async def start(self) -> None:
        await self.harness.__aenter__()
        for watcher_spec in self.spec.watchers:
            self._add(watcher_spec)
        self._tasks = [
            asyncio.create_task(self._persist_cycles(), name="reliability-persister"),
            asyncio.create_task(self._restart_failed(), name="reliability-restarter"),
        ]

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await self.harness.stop()
        for handle in (self._bound, self._persisted, self._errors):
            handle.close()

    async def run_forever(self) -> None:
        await self.start()
        try:
            await asyncio.Event().wait()
        finally:
            await self.stop()

    def _add(self, watcher_spec: WatcherSpec) -> Watcher:
        watcher = self.harness.add(watcher_spec.trigger(), before_bind=self._behaviour(watcher_spec))
        self._by_watcher[watcher.trigger_id] = watcher_spec
        return watcher

    @staticmethod
    def _behaviour(watcher_spec: WatcherSpec) -> Callable[[TriggerEvent], Awaitable[None]] | None:
        if watcher_spec.behaviour == "slow":

            async def slow(event: TriggerEvent) -> None:
                await asyncio.sleep(watcher_spec.delay)

            return slow
        if watcher_spec.behaviour == "hang":

            async def hang(event: TriggerEvent) -> None:
                await asyncio.Event().wait()

            return hang
        return None

    def _on_bound(self, watcher: Watcher, seq: int | None, event: TriggerEvent) -> None:
        name = self._by_watcher[watcher.trigger_id].name
        line = json.dumps({"i": self.spec.incarnation, "w": name, "n": message_number(event), "seq": seq})
        self._bound.write(line + "\n")
        self._pending.append(_Pending(seq, time.monotonic() + self.spec.persist_delay, line))

    @contextlib.asynccontextmanager
    async def persistence_held(self) -> AsyncIterator[None]:
        """
        Persist nothing inside (the supervisor stalls); bound events pile up in flight.

        What a scenario that acts on the broker "while something is in flight" holds, so what it
        sees in the files is still true when it acts: persisting in between would settle it.
        """
        self._persisting.clear()
        try:
            yield
        finally:
            self._persisting.set()

    async def _persist_cycles(self) -> None:
        while True:
            await asyncio.sleep(self.spec.sync_interval)
            await self._persisting.wait()
            now = time.monotonic()
            due = [p for p in self._pending if p.due <= now]
            if not due:
                continue
            self._pending = [p for p in self._pending if p.due > now]
            # Persist first (the supervisor's commit), confirm after: never the other way round.
            self._persisted.write("".join(p.line + "\n" for p in due))
            self._persisted.flush()
            self.harness.confirm([p.seq for p in due if p.seq is not None])

    async def _restart_failed(self) -> None:
        """
        Start failed watchers again after ``restart_after``: those that failed together, together.

        Airflow's triggerer re-creates every trigger still assigned to it that is not running in
        one pass of its loop, so the watchers of a group that failed together (its producer
        raised, and every subscriber got the error) subscribe again together. Restarting them
        one at a time, ``restart_after`` apart, made the later ones re-join a stream the first
        had already advanced (core limit 2, a late re-join): not the fault under test
        (tests/unit/test_reliability_restarts.py).
        """
        while True:
            await asyncio.sleep(0.1)
            failed = [w for w in self.harness.watchers.values() if w.error is not None]
            if not failed:
                continue
            restarting = []
            for watcher in failed:
                watcher_spec = self._by_watcher.pop(watcher.trigger_id)
                self.failures += 1
                self._errors.write(
                    json.dumps(
                        {
                            "i": self.spec.incarnation,
                            "w": watcher_spec.name,
                            "error": type(watcher.error).__name__,
                            "message": str(watcher.error)[:500],
                        }
                    )
                    + "\n"
                )
                await self.harness.remove(watcher)
                restarting.append(watcher_spec)
            await asyncio.sleep(self.spec.restart_after)
            for watcher_spec in restarting:
                self._add(watcher_spec)


def main(argv: list[str]) -> None:
    spec = TriggererSpec.load(Path(argv[1]))
    print(f"reliability triggerer {os.getpid()} incarnation {spec.incarnation}", flush=True)
    asyncio.run(PersistingTriggerer(spec).run_forever())


if __name__ == "__main__":
    main(sys.argv)
