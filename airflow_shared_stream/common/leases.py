"""
Lease keeping: stop the broker from redelivering a message while Airflow is still handling it.

SQS visibility timeouts, Pub/Sub ack deadlines and Service Bus locks are all leases that expire
while a message waits for its trigger events to be persisted, which under load takes a minute or
more. An expired lease means the broker hands the message out again while it is still
outstanding: a duplicate at best, and on a FIFO queue a lane that stalls. The keeper extends the
leases of outstanding messages on a schedule and stops extending a message once it is settled or
once it has been held for the ack timeout (by then Airflow has failed it and it must come back).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Collection, Hashable, Iterable
from typing import Generic, TypeVar

log = logging.getLogger(__name__)

RENEWALS_IN_FLIGHT = 4
"""Most lease-extension calls of one renewal pass on the wire at once (a broker may lower it)."""

LOOP_STALL_HEADROOM_SECONDS = 3.0
"""Lease a renewal leaves when it is due: a stall of the event loop (a loaded triggerer stalls it
for seconds) plus a round trip to the broker. A renewal due later than this before the lease ends
lets a stall of the loop lapse the lease, and the broker hands the message out again."""

MIN_RENEW_INTERVAL_SECONDS = 0.25
"""Shortest time between renewal passes a lease too short for the headroom gets (never more than a
third of the lease, though)."""


def renew_interval(lease_seconds: float) -> float:
    """
    Seconds between renewals of a lease of ``lease_seconds``: a third of it (a lease survives one
    failed renewal), or sooner where a third would leave less than LOOP_STALL_HEADROOM_SECONDS of it.
    """
    return min(
        lease_seconds / 3, max(MIN_RENEW_INTERVAL_SECONDS, lease_seconds - LOOP_STALL_HEADROOM_SECONDS)
    )


LeaseHandle = TypeVar("LeaseHandle", bound=Hashable)

ExtendLeases = Callable[[list[LeaseHandle], float], Awaitable[Collection[LeaseHandle] | None]]
"""Broker call that extends every given lease to ``seconds`` from now.

It may return the handles whose lease the broker refused (already expired, already settled
elsewhere): those are lease losses, dropped from the keeper and counted.
"""


class LeaseKeeper(Generic[LeaseHandle]):
    """
    Extend the leases of outstanding messages until they are settled or held too long.

    Passes start every ``renew_every`` seconds, counted from the start of the previous pass, and
    a pass sends its chunks of ``batch_size`` leases together (at most ``calls_in_flight`` at
    once): a lease goes at most ``renew_every`` plus one round trip without renewal, however many
    messages are in flight (chunks sent one after another would add a round trip per chunk to
    every pass, and a short lease could run out between two renewals).

    No lock spans a renewal pass or a settlement. A settlement only waits for the in-flight
    renewal call that includes one of its own messages (so no renewal can land after the
    settlement and re-lease a message just released to the broker), and a renewal never waits
    for a settlement, however long its dead-letter retries take. Other leases keep being renewed
    meanwhile.

    :param extend: broker call extending a list of leases to ``lease_seconds`` from now.
    :param lease_seconds: the lease each extension grants.
    :param max_hold_seconds: stop extending a message held this long (normally the triggerer's
        ``shared_stream_ack_timeout``): Airflow fails it then, and the broker must redeliver it.
    :param renew_every: seconds between renewal passes; by default :func:`renew_interval`: a
        third of the lease, or sooner when that would leave too little headroom for a stalled loop.
    :param batch_size: most leases per extension call (the broker's batch limit).
    :param calls_in_flight: most extension calls of one pass on the wire at once.
    :param on_extended: called with the number of leases each successful call extended.
    :param on_lost: called with the number of leases lost (refused by the broker, or let go at
        the ack timeout).
    """

    def __init__(
        self,
        extend: ExtendLeases[LeaseHandle],
        *,
        lease_seconds: float,
        max_hold_seconds: float,
        renew_every: float | None = None,
        batch_size: int | None = None,
        calls_in_flight: int = RENEWALS_IN_FLIGHT,
        clock: Callable[[], float] = time.monotonic,
        on_extended: Callable[[int], None] | None = None,
        on_lost: Callable[[int], None] | None = None,
    ) -> None:
        if lease_seconds <= 0:
            raise ValueError(f"lease_seconds must be positive, got {lease_seconds}")
        self._extend = extend
        self.lease_seconds = lease_seconds
        self.max_hold_seconds = max_hold_seconds
        self.renew_every = renew_every if renew_every is not None else renew_interval(lease_seconds)
        self.batch_size = batch_size
        if calls_in_flight < 1:
            raise ValueError(f"calls_in_flight must be at least 1, got {calls_in_flight}")
        self.calls_in_flight = calls_in_flight
        self._clock = clock
        self._on_extended = on_extended or _ignore
        self._on_lost = on_lost or _ignore
        self._held: dict[LeaseHandle, float] = {}
        # handle -> event set when the renewal call carrying it returns.
        self._renewing: dict[LeaseHandle, asyncio.Event] = {}
        self._task: asyncio.Task[None] | None = None
        self._sooner = math.inf
        """Loop time by which :meth:`renew_within` wants the next pass started."""
        self._woken = asyncio.Event()

    def __len__(self) -> int:
        return len(self._held)

    def __contains__(self, handle: object) -> bool:
        return handle in self._held

    def hold(self, handle: LeaseHandle) -> None:
        """Start keeping the lease of a message that has just been received."""
        self.hold_all((handle,))

    def hold_all(self, handles: Iterable[LeaseHandle]) -> None:
        """Start keeping the leases of the messages of one receive, received at one time."""
        now = self._clock()
        held = self._held
        for handle in handles:
            held.setdefault(handle, now)

    def hold_unbounded(self, handles: Iterable[LeaseHandle]) -> None:
        """
        Keep renewing these held leases past ``max_hold_seconds``: their holder bounds them itself.

        For messages no watcher has seen (:mod:`.unseen`): Airflow does not time them out, so the
        ack timeout says nothing about them. A lease not held any more (lost) stays dropped.
        """
        held = self._held
        for handle in handles:
            if handle in held:
                held[handle] = math.inf

    def hold_afresh(self, handles: Iterable[LeaseHandle]) -> None:
        """Count the hold of these held leases from now (a message handed to the watchers again)."""
        now = self._clock()
        held = self._held
        for handle in handles:
            if handle in held:
                held[handle] = now

    @contextlib.asynccontextmanager
    async def settling(self, handles: Iterable[LeaseHandle]) -> AsyncIterator[None]:
        """
        Stop keeping ``handles`` and settle them on the broker inside this block.

        Waits only for renewal calls already on the wire for these handles, so none can
        overtake the settlement; no new renewal picks them up once this is entered.
        """
        handles = list(handles)
        held = self._held
        for handle in handles:
            held.pop(handle, None)
        renewing = self._renewing
        if renewing:  # most of the time no renewal is on the wire: no lookup per handle
            pending = {id(event): event for h in handles if (event := renewing.get(h)) is not None}
            for event in pending.values():
                await event.wait()
        yield

    def forget(self, handles: Iterable[LeaseHandle]) -> None:
        """Stop keeping ``handles`` without settling them (their lease simply runs out)."""
        for handle in handles:
            self._held.pop(handle, None)

    async def renew_once(self) -> int:
        """
        Run one renewal pass; return how many leases were extended.

        Messages held past ``max_hold_seconds`` are dropped from the keeper and left to expire.
        A failed renewal call is logged and retried on the next pass: the worst a lost lease
        causes is a redelivery, which at-least-once allows.
        """
        now = self._clock()
        # A lease held unbounded is stamped infinitely late: now - inf never reaches the bound.
        expired = [h for h, since in self._held.items() if now - since >= self.max_hold_seconds]
        if expired:
            log.warning(
                "Not extending %d lease(s) held past %.0fs (the ack timeout); the broker will redeliver them",
                len(expired),
                self.max_hold_seconds,
            )
            self.forget(expired)
            self._on_lost(len(expired))
        handles = list(self._held)
        size = self.batch_size or len(handles) or 1
        slots = asyncio.Semaphore(self.calls_in_flight)

        async def renew(chunk: list[LeaseHandle]) -> int:
            async with slots:
                # Settled since the pass began: skip, its settlement already went out.
                chunk = [h for h in chunk if h in self._held]
                return await self._renew_chunk(chunk) if chunk else 0

        chunks = [handles[start : start + size] for start in range(0, len(handles), size)]
        return sum(await asyncio.gather(*(renew(chunk) for chunk in chunks)))

    async def _renew_chunk(self, chunk: list[LeaseHandle]) -> int:
        done = asyncio.Event()
        for handle in chunk:
            self._renewing[handle] = done
        try:
            lost = await self._extend(chunk, self.lease_seconds)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.warning(
                "Extending %d lease(s) failed (%s: %s); retrying next pass",
                len(chunk),
                type(exc).__name__,
                exc,
            )
            return 0
        finally:
            for handle in chunk:
                if self._renewing.get(handle) is done:
                    del self._renewing[handle]
            done.set()
        lost = list(lost or ())
        if lost:
            log.warning("The broker refused to extend %d lease(s); they will be redelivered", len(lost))
            self.forget(lost)
            self._on_lost(len(lost))
        self._on_extended(len(chunk) - len(lost))
        return len(chunk) - len(lost)

    def renew_within(self, seconds: float) -> None:
        """
        Start the next renewal pass within ``seconds`` from now: sooner than planned, never later.

        For a broker that says how long each lease lasts only as it hands a message over (Service
        Bus locks): a lease shorter than the keeper planned for is still renewed in time.
        """
        self._sooner = min(self._sooner, asyncio.get_running_loop().time() + max(0.0, seconds))
        self._woken.set()

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        due = loop.time() + self.renew_every
        while True:
            while (delay := min(due, self._sooner) - loop.time()) > 0:
                self._woken.clear()
                # asyncio.wait, not wait_for: wait_for swallows a cancel that meets the wake-up
                # (Python < 3.12), and stop() would wait for this task for ever.
                woken = asyncio.ensure_future(self._woken.wait())
                try:
                    await asyncio.wait([woken], timeout=delay)
                finally:
                    woken.cancel()
            self._sooner = math.inf
            started = loop.time()
            await self.renew_once()
            # Start to start: a pass that took longer than renew_every is followed at once.
            due = started + self.renew_every

    def start(self) -> None:
        """Start the background renewal task (idempotent)."""
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._run(), name="shared-stream-lease-keeper")

    async def stop(self) -> None:
        """Stop renewing; held leases simply run out and the broker redelivers them."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task


def _ignore(count: int) -> None:
    pass
