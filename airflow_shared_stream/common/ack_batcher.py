"""
Coalesce the ACKs of many advances into full broker batches, sent in the background.

The manager advances each lane's contiguous prefix as soon as its trigger events are persisted,
often a few messages at a time; acking each piece on its own costs a broker call per piece. The
batcher sends a batch once it is full, once nothing else is in flight (nothing more could join
it), or ``linger`` seconds after its first ACK waited, the way the Kafka committer coalesces
commits. A full batch is ``settle_batch_limit`` or the credit window, whichever is smaller: one
persistence cycle resolves at most a window of messages.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import Callable, Coroutine, Sequence
from typing import Any, Generic

from airflow_shared_stream.common.delivery import Delivery, Handle

log = logging.getLogger(__name__)

ACK_LINGER_SECONDS = 2.0
"""Longest an ACK waits for others to fill a batch. Its lease is kept renewed meanwhile, so it is
safe with any lease; a triggerer that dies meanwhile only means redelivery."""

ACK_FLUSH_TIMEOUT_SECONDS = 10.0
"""How long closing waits for the ACKs still queued or on the wire (then the broker redelivers
them)."""

ACK_SENDS_IN_FLIGHT = 4
"""Most ACK batches on the wire at once per stream.

Sending in the background lets the advance return and its credits come back while the broker
confirms. Bounded, because a queued ACK no longer holds a credit: with this many batches on the
wire the advance that fills the next one waits, so the manager is slowed rather than memory
growing. A broker may lower it (``LeasedQueueProducer.ack_sends_in_flight``)."""


class AckBatcher(Generic[Handle]):
    """
    Queue ACKs and send them in batches of at most ``batch_limit``, at most ``max_sending`` at once.

    A batch starts when it fills (:meth:`add`), ``linger`` seconds after the first ACK of a round
    was queued, or at :meth:`flush`; callers wait for a free send slot, never for the send.
    At-least-once holds because only an advance queues an ACK, ``send`` keeps the leases until
    the ACK is on the wire, and :meth:`drain` waits for every send. The first failed send is
    kept in :attr:`error` for the producer to raise from its next advance or receive; that
    batch's messages come back when their leases run out.
    """

    def __init__(
        self,
        send: Callable[[list[Delivery[Handle]]], Coroutine[Any, Any, None]],
        *,
        batch_limit: int | None,
        linger: float,
        max_sending: int = ACK_SENDS_IN_FLIGHT,
    ) -> None:
        if max_sending < 1:
            raise ValueError(f"max_sending must be at least 1, got {max_sending}")
        self._send = send
        self.batch_limit = batch_limit
        self.linger = linger
        self.max_sending = max_sending
        self._queued: list[Delivery[Handle]] = []
        # send task -> the batch it carries, until the task is done
        self._sending: dict[asyncio.Task[None], list[Delivery[Handle]]] = {}
        self._wakeup = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self.error: BaseException | None = None

    def __len__(self) -> int:
        """Deliveries whose ACK is not settled yet: queued, or on the wire."""
        return len(self._queued) + sum(len(batch) for batch in self._sending.values())

    @property
    def queued(self) -> list[Delivery[Handle]]:
        """Deliveries whose ACK is queued or on the wire (a copy)."""
        return [*itertools.chain.from_iterable(self._sending.values()), *self._queued]

    @property
    def sending(self) -> int:
        """ACK batches on the wire now."""
        return len(self._sending)

    async def add(self, deliveries: Sequence[Delivery[Handle]]) -> None:
        """Queue ``deliveries`` for ACK; start sending every batch that is full now."""
        if self.put(deliveries):
            await self.send_full()

    def put(self, deliveries: Sequence[Delivery[Handle]]) -> bool:
        """
        Queue ``deliveries`` for ACK without a suspension point; True if a batch is full now.

        The caller then awaits :meth:`send_full`. :meth:`add` in two halves, so the common
        advance (its ACKs join a batch that is not full yet) does not build a coroutine.
        """
        queued = self._queued
        first = not queued
        queued.extend(deliveries)
        limit = self.batch_limit
        if limit and len(queued) >= limit:
            return True
        if first and queued:
            # The first of a round starts the linger (see _run); later ones join it. Whenever
            # _run waits for a wakeup, the queue is empty or the wakeup is set: its flush takes
            # everything queued meanwhile, and send_full sets it for what a full batch leaves.
            self._wakeup.set()
        return False

    async def send_full(self) -> None:
        """Start sending every batch that is full (waiting for a free slot); linger the rest."""
        limit = self.batch_limit
        while limit and len(self._queued) >= limit:
            await self._start(limit)
        if self._queued:
            self._wakeup.set()

    async def flush(self) -> None:
        """Start sending everything queued now, in batches of at most ``batch_limit``."""
        while self._queued:
            await self._start(self.batch_limit or len(self._queued))

    async def drain(self) -> None:
        """Send everything queued and wait for every send; raise the first failure not raised yet."""
        await self.flush()
        while self._sending:
            await asyncio.wait(list(self._sending))
        error, self.error = self.error, None
        if error is not None:
            raise error

    async def _start(self, size: int) -> None:
        while len(self._sending) >= self.max_sending:
            await asyncio.wait(list(self._sending), return_when=asyncio.FIRST_COMPLETED)
        if not self._queued:  # another caller started them while this one waited for a slot
            return
        batch, self._queued = self._queued[:size], self._queued[size:]
        task = asyncio.create_task(self._send(batch), name="shared-stream-ack-send")
        self._sending[task] = batch
        task.add_done_callback(self._sent)

    def _sent(self, task: asyncio.Task[None]) -> None:
        batch = self._sending.pop(task, [])
        if task.cancelled():
            return
        exc = task.exception()
        if exc is not None:
            log.warning(
                "Sending %d ACK(s) failed (%s: %s); the broker redelivers them",
                len(batch),
                type(exc).__name__,
                exc,
            )
            if self.error is None:
                self.error = exc

    async def _run(self) -> None:
        while True:
            await self._wakeup.wait()
            await asyncio.sleep(self.linger)
            self._wakeup.clear()
            await self.flush()

    def start(self) -> None:
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._run(), name="shared-stream-ack-batcher")

    async def stop(self) -> None:
        """Stop lingering and cancel the sends still on the wire (after :meth:`drain`, none are)."""
        task, self._task = self._task, None
        tasks = [*([task] if task is not None else []), *self._sending]
        for each in tasks:
            each.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
