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
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Hashable, Iterable
from typing import Generic, TypeVar

log = logging.getLogger(__name__)

LeaseHandle = TypeVar("LeaseHandle", bound=Hashable)

ExtendLeases = Callable[[list[LeaseHandle], float], Awaitable[None]]
"""Broker call that extends every given lease to ``seconds`` from now."""


class LeaseKeeper(Generic[LeaseHandle]):
    """
    Extend the leases of outstanding messages until they are settled or held too long.

    :param extend: broker call extending a list of leases to ``lease_seconds`` from now.
    :param lease_seconds: the lease each extension grants.
    :param max_hold_seconds: stop extending a message held this long (normally the triggerer's
        ``shared_stream_ack_timeout``): Airflow fails it then, and the broker must redeliver it.
    :param renew_every: seconds between renewal passes; a third of the lease by default, so a
        lease survives one failed renewal.
    """

    def __init__(
        self,
        extend: ExtendLeases[LeaseHandle],
        *,
        lease_seconds: float,
        max_hold_seconds: float,
        renew_every: float | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if lease_seconds <= 0:
            raise ValueError(f"lease_seconds must be positive, got {lease_seconds}")
        self._extend = extend
        self.lease_seconds = lease_seconds
        self.max_hold_seconds = max_hold_seconds
        self.renew_every = renew_every if renew_every is not None else lease_seconds / 3
        self._clock = clock
        self._held: dict[LeaseHandle, float] = {}
        # Held while a renewal call or a settlement is on the wire, so a renewal can never
        # land after a settlement and re-lease a message that was just released to the broker.
        self._lock = asyncio.Lock()
        self._task: asyncio.Task[None] | None = None

    def __len__(self) -> int:
        return len(self._held)

    def __contains__(self, handle: object) -> bool:
        return handle in self._held

    def hold(self, handle: LeaseHandle) -> None:
        """Start keeping the lease of a message that has just been received."""
        self._held.setdefault(handle, self._clock())

    @contextlib.asynccontextmanager
    async def settling(self, handles: Iterable[LeaseHandle]) -> AsyncIterator[None]:
        """
        Stop keeping ``handles`` and settle them on the broker inside this block.

        No renewal call runs while the block runs, so none can overtake the settlement.
        """
        async with self._lock:
            for handle in handles:
                self._held.pop(handle, None)
            yield

    def forget(self, handles: Iterable[LeaseHandle]) -> None:
        """Stop keeping ``handles`` without settling them (their lease simply runs out)."""
        for handle in handles:
            self._held.pop(handle, None)

    async def renew_once(self) -> int:
        """
        Run one renewal pass; return how many leases were extended.

        Messages held past ``max_hold_seconds`` are dropped from the keeper and left to expire.
        A failed renewal is logged and retried on the next pass: the worst a lost lease causes
        is a redelivery, which at-least-once allows.
        """
        async with self._lock:
            now = self._clock()
            expired = [h for h, since in self._held.items() if now - since >= self.max_hold_seconds]
            if expired:
                log.warning(
                    "Not extending %d lease(s) held past %.0fs (the ack timeout); "
                    "the broker will redeliver them",
                    len(expired),
                    self.max_hold_seconds,
                )
                self.forget(expired)
            handles = list(self._held)
            if not handles:
                return 0
            try:
                await self._extend(handles, self.lease_seconds)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning(
                    "Extending %d lease(s) failed (%s: %s); retrying next pass",
                    len(handles),
                    type(exc).__name__,
                    exc,
                )
                return 0
            return len(handles)

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.renew_every)
            await self.renew_once()

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
