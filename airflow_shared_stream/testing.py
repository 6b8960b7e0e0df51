"""
Run watchers' triggers through Airflow's real shared-stream manager, without a deployment.

:class:`SharedStreamHarness` does what the triggerer does with event triggers, using the
:class:`~airflow.triggers.shared_stream.SharedStreamManager` that ships with Airflow:

* rebuilds each trigger from its ``serialize()`` output, as the triggerer rebuilds it from the
  database (so a trigger that does not round-trip fails here, not in production);
* subscribes it under its ``shared_stream_key()`` and drives ``filter_shared_stream``;
* binds every trigger event it yields to the raw event behind it (``bind_pending_event``);
* plays the supervisor: confirms persistence of each bound event after ``confirm_after``
  seconds (Airflow's state sync takes 1-1.4 s), or only when the test calls :meth:`confirm`,
  or never while :attr:`persisting` is off, which is how an ack timeout is provoked;
* unsubscribes on removal and stops every group on :meth:`stop`, as a triggerer shutdown does.

Example::

    async with SharedStreamHarness(confirm_after=0.0) as harness:
        orders = harness.add(SqsSharedStreamTrigger(queue_url=url, match="body.kind == 'order'"))
        await orders.wait_for_events(3)
        assert [e.payload["body"]["id"] for e in orders.events] == [1, 2, 3]
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import os
import time
from collections.abc import Awaitable, Callable, Collection, Hashable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from airflow.sdk.module_loading import import_string
from airflow.triggers.base import BaseEventTrigger, TriggerEvent
from airflow.triggers.shared_stream import (
    DEFAULT_ACK_TIMEOUT,
    DEFAULT_SUBSCRIBER_QUEUE_MAX,
    SharedStreamManager,
)

from airflow_shared_stream.common.leased_queue import DeadLetter, Delivery, LeasedQueueProducer
from airflow_shared_stream.common.matching import build_message
from airflow_shared_stream.common.process_scope import triggerer_scope
from airflow_shared_stream.common.settlement import Settlement
from airflow_shared_stream.common.trigger import SharedStreamTrigger

ACK_TIMEOUT_ENV = "AIRFLOW__TRIGGERER__SHARED_STREAM_ACK_TIMEOUT"
"""``[triggerer] shared_stream_ack_timeout`` as an environment variable (Airflow reads it first)."""
_UNSET = object()

__all__ = [
    "InMemoryProducer",
    "InMemoryQueue",
    "InMemoryStateStore",
    "InMemoryTrigger",
    "SharedStreamHarness",
    "Watcher",
]


class InMemoryStateStore:
    """
    An asset state store in memory, with the accessor API Airflow gives a trigger
    (``BaseEventTrigger.asset_state_store``): ``aget``/``aset``/``adelete`` and their sync forms.
    Values go through JSON, as the database keeps them. Share one between two harnesses to play a
    triggerer restart (the store is the metadata database's, not the triggerer's).
    """

    def __init__(self) -> None:
        self.values: dict[str, str] = {}
        self.reads = 0
        self.writes = 0

    def get(self, key: str, default: Any = None) -> Any:
        self.reads += 1
        return json.loads(self.values[key]) if key in self.values else default

    def set(self, key: str, value: Any) -> None:
        self.writes += 1
        self.values[key] = json.dumps(value)

    def delete(self, key: str) -> None:
        self.values.pop(key, None)

    async def aget(self, key: str, default: Any = None) -> Any:
        return self.get(key, default)

    async def aset(self, key: str, value: Any) -> None:
        self.set(key, value)

    async def adelete(self, key: str) -> None:
        self.delete(key)


@dataclass
class Watcher:
    """One trigger running in the harness, with what it has produced so far."""

    trigger_id: int
    trigger: BaseEventTrigger
    key: Hashable
    events: list[TriggerEvent] = field(default_factory=list)
    error: BaseException | None = None
    task: asyncio.Task[None] | None = None
    before_bind: Callable[[TriggerEvent], Awaitable[None]] | None = None
    """Awaited after the filter yielded an event and before it is bound: a slow or hung runner."""
    _changed: asyncio.Event = field(default_factory=asyncio.Event, repr=False)

    @property
    def payloads(self) -> list[Any]:
        return [event.payload for event in self.events]

    async def wait_for_events(self, count: int, timeout: float = 30.0) -> list[TriggerEvent]:
        """Wait until at least ``count`` events arrived; raise on timeout or trigger failure."""
        return await self._wait(lambda: len(self.events) >= count, timeout, f"{count} events")

    async def wait_for_error(self, timeout: float = 30.0) -> BaseException:
        """Wait until the trigger failed, as the triggerer would fail it, and return the error."""
        await self._wait(lambda: self.error is not None, timeout, "an error", raise_error=False)
        assert self.error is not None
        return self.error

    async def _wait(
        self, done: Callable[[], bool], timeout: float, what: str, *, raise_error: bool = True
    ) -> list[TriggerEvent]:
        deadline = time.monotonic() + timeout
        while not done():
            if raise_error and self.error is not None:
                raise AssertionError(f"trigger {self.trigger_id} failed: {self.error!r}") from self.error
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(
                    f"trigger {self.trigger_id} did not produce {what} in {timeout}s "
                    f"(has {len(self.events)} events, error={self.error!r})"
                )
            self._changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), min(remaining, 0.5))
        return self.events


class SharedStreamHarness:
    """
    A triggerer in a box for shared-stream triggers (see the module docstring).

    :param confirm_after: seconds after which each bound trigger event is confirmed persisted,
        or a callable drawing that delay per event (uneven persistence); ``None`` confirms only
        through :meth:`confirm`.
    :param sync_interval: how often the simulated supervisor delivers confirmations.
    :param ack_timeout: the manager's per-event ack timeout (``[triggerer] shared_stream_ack_timeout``).
    :param max_subscriber_queue: ``[triggerer] shared_stream_subscriber_queue_size``.
    :param cohort_grace_period: ``[triggerer] shared_stream_cohort_grace_period``.
    :param on_bound: called with ``(watcher, seq, event)`` right after each trigger event is bound,
        for a test's own persistence (write the event down, confirm it later with :meth:`confirm`).
    :param state_store: every trigger's ``asset_state_store`` (an :class:`InMemoryStateStore`, say);
        ``None``, as for a trigger without an asset, by default.
    """

    def __init__(
        self,
        *,
        confirm_after: float | Callable[[], float] | None = 0.0,
        sync_interval: float = 0.02,
        ack_timeout: float = DEFAULT_ACK_TIMEOUT,
        max_subscriber_queue: int = DEFAULT_SUBSCRIBER_QUEUE_MAX,
        cohort_grace_period: float = 0.0,
        on_bound: Callable[[Watcher, int | None, TriggerEvent], None] | None = None,
        state_store: Any = None,
    ) -> None:
        self.manager = SharedStreamManager(
            ack_timeout=ack_timeout,
            max_subscriber_queue=max_subscriber_queue,
            cohort_grace_period=cohort_grace_period,
        )
        self.confirm_after = confirm_after
        self.on_bound = on_bound
        self.state_store = state_store
        self.sync_interval = sync_interval
        self.persisting = True
        """Set to False to stop confirming persistence (a metadata database that is down)."""
        self.watchers: dict[int, Watcher] = {}
        self._ids = itertools.count(1)
        # seq -> (when it is due for confirmation, which trigger bound it)
        self._unconfirmed: dict[int, tuple[float, int]] = {}
        self._supervisor: asyncio.Task[None] | None = None
        self._scope: dict[str, Any] = {}
        self._saved_ack_timeout: str | object | None = _UNSET

    async def __aenter__(self) -> SharedStreamHarness:
        # A triggerer gives its manager [triggerer] shared_stream_ack_timeout, and producers read
        # the same setting (how long leases are worth renewing, how long a message nobody saw is
        # held): while it runs, the harness's ack timeout is that setting.
        self._saved_ack_timeout = os.environ.get(ACK_TIMEOUT_ENV)
        os.environ[ACK_TIMEOUT_ENV] = repr(float(self.manager._ack_timeout))
        self._supervisor = asyncio.create_task(self._supervise(), name="harness-supervisor")
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.stop()

    def add(
        self,
        trigger: BaseEventTrigger,
        *,
        before_bind: Callable[[TriggerEvent], Awaitable[None]] | None = None,
    ) -> Watcher:
        """
        Start a trigger as the triggerer would, rebuilt from its ``serialize()`` output.

        ``before_bind`` is awaited for each event before it is bound (a runner that is slow, or
        hangs, on an event; the manager sees a subscriber that has not finished it).
        """
        rebuilt = _rebuild(trigger)
        key = rebuilt.shared_stream_key()
        if key is None:
            raise ValueError(f"{type(trigger).__name__} does not declare a shared_stream_key")
        watcher = Watcher(trigger_id=next(self._ids), trigger=rebuilt, key=key, before_bind=before_bind)
        rebuilt.trigger_id = watcher.trigger_id  # as TriggerRunner does
        if self.state_store is not None:
            rebuilt.asset_state_store = self.state_store  # as the triggerer gives one per asset
        watcher.task = asyncio.create_task(self._run(watcher), name=f"harness-trigger-{watcher.trigger_id}")
        self.watchers[watcher.trigger_id] = watcher
        return watcher

    async def remove(self, watcher: Watcher) -> None:
        """Cancel one trigger (a Dag removed or paused); it unsubscribes on the way out."""
        if watcher.task is not None:
            watcher.task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watcher.task
        self.watchers.pop(watcher.trigger_id, None)

    def confirm(self, seqs: Iterable[int] | None = None, *, watcher: Watcher | None = None) -> int:
        """
        Confirm persistence of bound trigger events; return how many were confirmed.

        ``seqs`` picks events by sequence number, ``watcher`` picks every unconfirmed event of
        one trigger, and neither confirms everything unconfirmed.
        """
        if seqs is not None:
            chosen = list(seqs)
        elif watcher is not None:
            chosen = [seq for seq, (_, tid) in self._unconfirmed.items() if tid == watcher.trigger_id]
        else:
            chosen = list(self._unconfirmed)
        for seq in chosen:
            self._unconfirmed.pop(seq, None)
        self.manager.confirm_persisted(chosen)
        return len(chosen)

    @property
    def unconfirmed(self) -> int:
        return len(self._unconfirmed)

    async def stop(self) -> None:
        """Shut down like the triggerer: cancel every trigger, then stop every group."""
        for watcher in list(self.watchers.values()):
            await self.remove(watcher)
        await self.manager.stop_all()
        saved, self._saved_ack_timeout = self._saved_ack_timeout, _UNSET
        if isinstance(saved, str):
            os.environ[ACK_TIMEOUT_ENV] = saved
        elif saved is None:
            os.environ.pop(ACK_TIMEOUT_ENV, None)
        if self._supervisor is not None:
            self._supervisor.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._supervisor
            self._supervisor = None

    async def _run(self, watcher: Watcher) -> None:
        # This harness is one triggerer process: its own per-process stream state, inherited by
        # the manager's tasks created below (two harnesses in one test are two triggerers).
        triggerer_scope.set(self._scope)
        # Mirrors TriggerRunner.run_trigger for a trigger with a shared_stream_key.
        stream = self.manager.subscribe(
            trigger_id=watcher.trigger_id, trigger=watcher.trigger, key=watcher.key
        )
        try:
            async for event in watcher.trigger.filter_shared_stream(stream):
                # The runner awaits a log call here before binding (a real suspension point).
                await asyncio.sleep(0)
                if watcher.before_bind is not None:
                    await watcher.before_bind(event)
                seq = self.manager.bind_pending_event(trigger_id=watcher.trigger_id, key=watcher.key)
                if seq is not None:
                    self._unconfirmed[seq] = (time.monotonic() + self._delay(), watcher.trigger_id)
                if self.on_bound is not None:
                    self.on_bound(watcher, seq, event)
                watcher.events.append(event)
                watcher._changed.set()
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            watcher.error = exc
            watcher._changed.set()
        finally:
            await self.manager.unsubscribe(watcher.trigger_id, watcher.key)

    def _delay(self) -> float:
        if self.confirm_after is None:
            return 0.0
        return self.confirm_after() if callable(self.confirm_after) else self.confirm_after

    async def _supervise(self) -> None:
        while True:
            await asyncio.sleep(self.sync_interval)
            if self.confirm_after is None or not self.persisting or not self._unconfirmed:
                continue
            now = time.monotonic()
            due = [seq for seq, (due_at, _) in self._unconfirmed.items() if due_at <= now]
            if due:
                self.confirm(due)


def _rebuild(trigger: BaseEventTrigger) -> BaseEventTrigger:
    classpath, kwargs = trigger.serialize()
    # The triggerer stores kwargs in the metadata database; insist they survive JSON.
    kwargs = json.loads(json.dumps(kwargs))
    trigger_class = import_string(classpath)
    return trigger_class(**kwargs)


@dataclass
class InMemoryQueue:
    """
    A leased queue in memory: what :class:`InMemoryProducer` reads and settles.

    ``settled`` records every settlement per message number, in order (a redelivered message
    shows ``[REDELIVER, ACK]``); ``dead_letters`` keeps ``(number, reason, description)``.
    """

    pending: list[tuple[int, Any, Hashable | None]] = field(default_factory=list)
    settled: dict[int, list[Settlement]] = field(default_factory=dict)
    dead_letters: list[tuple[int, str, str]] = field(default_factory=list)
    max_in_flight_seen: int = 0
    lease_extensions: int = 0
    _numbers: Any = field(default_factory=itertools.count)
    _arrived: asyncio.Event | None = None

    def publish(self, body: Any, *, lane: Hashable | None = None) -> int:
        """Enqueue one message (a JSON-able body, or bytes/str as the broker would carry)."""
        number = next(self._numbers)
        self.pending.append((number, body, lane))
        if self._arrived is not None:
            self._arrived.set()
        return number

    def settlements(self, settlement: Settlement) -> list[int]:
        """Message numbers whose last settlement is ``settlement``."""
        return sorted(n for n, history in self.settled.items() if history and history[-1] is settlement)


class InMemoryProducer(LeasedQueueProducer[int]):
    """
    The leased-queue template over an :class:`InMemoryQueue`: for tests and benchmarks.

    It runs the real receive loop, credit window, lanes, lease keeper and settlement of
    :class:`~airflow_shared_stream.common.leased_queue.LeasedQueueProducer`; only the broker
    is a list. Queues are per ``stream`` name, shared by the class (one triggerer process).
    """

    broker = "memory"
    receive_limit = 10
    settle_batch_limit = 10
    queues: dict[str, InMemoryQueue] = {}

    def __init__(
        self,
        *,
        stream: str,
        max_in_flight: int,
        max_payload_bytes: int,
        dead_letter: str | None = None,
        **_shaping: Any,
    ) -> None:
        super().__init__(max_in_flight=max_in_flight, stream_label=stream)
        self.stream = stream
        self.dead_letter_to = dead_letter
        self._max_payload_bytes = max_payload_bytes
        self._received: dict[int, tuple[Any, Hashable | None]] = {}

    @classmethod
    def queue(cls, stream: str) -> InMemoryQueue:
        return cls.queues.setdefault(stream, InMemoryQueue())

    @classmethod
    def reset(cls) -> None:
        cls.queues.clear()

    async def connect(self) -> float:
        return 30.0

    async def receive(self, max_messages: int) -> Sequence[Delivery[int]]:
        queue = self.queue(self.stream)
        while not queue.pending:
            queue._arrived = asyncio.Event()
            await queue._arrived.wait()
        taken, queue.pending[:] = queue.pending[:max_messages], queue.pending[max_messages:]
        deliveries = []
        for number, body, lane in taken:
            self._received[number] = (body, lane)
            data = body if isinstance(body, bytes | str) else json.dumps(body)
            message = build_message(
                data,
                metadata={"number": number, "stream": self.stream},
                label=f"{self.stream}#{number}",
                max_payload_bytes=self._max_payload_bytes,
            )
            size = len(data.encode("utf-8")) if isinstance(data, str) else len(data)
            deliveries.append(
                Delivery(
                    message=message, handle=number, lease=number, lane=lane, size=size, message_id=str(number)
                )
            )
        queue.max_in_flight_seen = max(queue.max_in_flight_seen, self.in_flight + len(deliveries))
        return deliveries

    def _record(self, numbers: Iterable[int], settlement: Settlement) -> None:
        queue = self.queue(self.stream)
        for number in numbers:
            queue.settled.setdefault(number, []).append(settlement)

    async def ack(self, deliveries: Sequence[Delivery[int]]) -> None:
        self._record((d.handle for d in deliveries), Settlement.ACK)
        self._forget(deliveries)

    def _forget(self, deliveries: Iterable[Delivery[int]]) -> None:
        """A message that left the queue is not kept for redelivery (a long stream would grow)."""
        for delivery in deliveries:
            self._received.pop(delivery.handle, None)

    async def redeliver(self, deliveries: Sequence[Delivery[int]]) -> None:
        self._record((d.handle for d in deliveries), Settlement.REDELIVER)
        queue = self.queue(self.stream)
        back = [(d.handle, *self._received[d.handle]) for d in deliveries]
        queue.pending[:0] = sorted(back, key=lambda entry: entry[0])
        if queue._arrived is not None:
            queue._arrived.set()

    async def dead_letter(self, letters: Sequence[DeadLetter[int]]) -> None:
        queue = self.queue(self.stream)
        self._record((x.delivery.handle for x in letters), Settlement.DEAD_LETTER)
        queue.dead_letters.extend((x.delivery.handle, x.reason, x.description) for x in letters)
        self._forget(x.delivery for x in letters)

    async def extend_leases(
        self, deliveries: Sequence[Delivery[int]], seconds: float
    ) -> Collection[Delivery[int]]:
        self.queue(self.stream).lease_extensions += len(deliveries)
        return ()

    async def disconnect(self) -> None:
        pass


class InMemoryTrigger(SharedStreamTrigger):
    """
    A trigger on an :class:`InMemoryQueue`: the stream is ``stream``, ``dead_letter`` shapes it.

    Publish with ``InMemoryProducer.queue("name").publish({...})``.
    """

    broker = "memory"
    identity_fields = ("stream",)
    shaping_fields = ("dead_letter",)
    producer_class = InMemoryProducer

    def __init__(self, stream: str, *, dead_letter: str | None = None, **common: Any) -> None:
        super().__init__(**common)
        self.stream = stream
        self.dead_letter = dead_letter
