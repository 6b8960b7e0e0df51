"""
The advance half of the leased-queue template: settle what the manager advanced.

Each message's settlement comes from one decision table (:mod:`.settlement`); an ordered lane's
later messages follow its redelivery (:mod:`.lanes`); a message no watcher has seen is held, not
given back (:mod:`.unseen`); unordered ACKs are queued for the :class:`~.ack_batcher.AckBatcher`.
Dead letters settle first, so a failed copy fails the advance before anything of the batch was
removed. Credits always come back. :class:`~.leased_queue.LeasedQueueProducer` is the stream half.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Collection, Hashable, Sequence
from typing import Any

from airflow.triggers.shared_stream import AdvanceItem

from airflow_shared_stream.common import metrics as m
from airflow_shared_stream.common.ack_batcher import AckBatcher
from airflow_shared_stream.common.backoff import NoSubscriberBackoff
from airflow_shared_stream.common.delivery import ACK_QUEUED, DeadLetter, Delivery, Handle, InFlight, chunked
from airflow_shared_stream.common.flow_control import CreditWindow
from airflow_shared_stream.common.lanes import LaneTracker
from airflow_shared_stream.common.leased_broker import LeasedQueueBroker
from airflow_shared_stream.common.leases import LeaseKeeper
from airflow_shared_stream.common.metrics import StreamMetrics
from airflow_shared_stream.common.settlement import Settlement, decide
from airflow_shared_stream.common.unseen import UnseenMessages

log = logging.getLogger(__name__)


class LeasedQueueAdvance(LeasedQueueBroker[Handle]):
    """
    Settles advanced batches and owns what the two halves share: ``credits`` (the stream's
    :class:`~.flow_control.CreditWindow`; subclasses read ``credits.max_in_flight``), the leases,
    the lanes, the ACK batcher and the messages held unseen.
    """

    def __init__(self, *, max_in_flight: int, stream_label: str) -> None:
        self.credits = CreditWindow(max_in_flight)
        self.metrics = StreamMetrics(self.broker, stream_label)
        self._backoff = NoSubscriberBackoff()
        self._leases: LeaseKeeper[Hashable] | None = None  # from open_stream on
        self._leased: dict[Hashable, Delivery[Handle]] = {}
        self._lanes = LaneTracker()
        self._acks: AckBatcher[Handle] = AckBatcher(
            self._send_acks,
            batch_limit=min(self.settle_batch_limit or max_in_flight, max_in_flight),
            linger=self.ack_linger_seconds,
            max_sending=self.ack_sends_in_flight,
        )
        # Messages no watcher has seen, kept with their credits and leases; the bound is set
        # when the stream opens.
        self._unseen: UnseenMessages[Delivery[Handle]] = UnseenMessages(hold_seconds=0.0)
        self._unseen_changed = asyncio.Event()

    def _hold_unseen(self, batch: Sequence[AdvanceItem], held: list[Delivery[Handle]]) -> None:
        """
        Keep, instead of redelivering, the messages of ``batch`` that reached nobody (``held``,
        from :meth:`plan_settlement`: with each, the later messages of its ordered lane).

        They keep their credits and leases (renewed without the ack-timeout bound: Airflow does
        not time them out; :mod:`.unseen` bounds them) and wait to be offered again.
        """
        if self._unseen.offered:
            kept = {id(delivery) for delivery in held}
            self._unseen.advanced(
                item.broker_payload.delivery.lease
                for item in batch
                if id(item.broker_payload.delivery) not in kept
            )
            self._unseen_changed.set()
        if held:
            self._unseen.hold(held)
            assert self._leases is not None
            self._leases.hold_unbounded(d.lease for d in held)
            self._unseen_changed.set()
            self.credits.wake()

    async def advance(self, batch: Sequence[AdvanceItem]) -> None:
        assert self._leases is not None
        if self._acks.error is not None:
            self._raise_ack_error()
        if self.ack_linger_seconds > 0 and not self._lanes.holding_back:
            full = self._queue_plain_acks(batch)
            if full is not None:
                # The common advance, inline: no coroutine unless a batch is full or nothing
                # else is in flight (then nothing more could join the queued ACKs).
                if full:
                    await self._acks.send_full()
                if self.credits.in_flight == 0:
                    await self._acks.flush()
                return
        later: list[Delivery[Handle]] = []
        held: list[Delivery[Handle]] = []
        try:
            plan = self.plan_settlement(batch, held)
            self._hold_unseen(batch, held)
            acks = plan[Settlement.ACK]
            if self.ack_linger_seconds > 0 and acks:
                # Unordered ACKs are queued; an ordered lane's are sent now (the broker holds
                # the rest of a FIFO group back until they are deleted).
                later = [d for d in acks if d.lane is None]
                for delivery in later:
                    delivery.message = ACK_QUEUED
                ordered = [d for d in acks if d.lane is not None] if len(later) < len(acks) else []
                plan[Settlement.ACK] = ordered
            if len(later) + len(held) < len(batch):  # something settles now (often nothing)
                deferred = {d.lease for d in later}
                deferred.update(d.lease for d in held)
                now = [
                    i.broker_payload.delivery.lease
                    for i in batch
                    if i.broker_payload.delivery.lease not in deferred
                ]
                with self.metrics.timed(m.ADVANCE_LATENCY):
                    async with self._leases.settling(now):
                        await self._settle(plan)
            # Only after everything else of the batch settled: a failed dead-letter copy
            # raises above and the whole batch comes back, its ACKs included.
            await self._acks.add(later)
            plan[Settlement.ACK] += later
        except BaseException:
            self._leases.forget(d.lease for d in later if d not in self._acks.queued)
            raise
        finally:
            kept = {d.lease for d in later}
            kept.update(d.lease for d in held)
            self._finish_tracking(batch, keep=kept, credits_kept=len(held))
        if self.credits.in_flight == 0:
            await self._acks.flush()  # nothing else is in flight: no other ACK could join these
        self._count(batch, plan)

    def _queue_plain_acks(self, batch: Sequence[AdvanceItem]) -> bool | None:
        """
        The common advance, without a settlement plan or a suspension point: every message ACK,
        none on an ordered lane, all queued for the ACK batcher.

        Returns ``None``, having changed nothing, when some message is not such an ACK (the
        general path decides); else True if an ACK batch is full (the caller awaits
        :meth:`AckBatcher.send_full`, whose wait for a send slot is the backpressure).
        """
        if self._unseen.offered:
            return None  # messages nobody saw are offered again: the general path tracks them
        fanned_out = 0
        for item in batch:
            outcome = item.outcome
            if outcome.failed or outcome.rejected or not outcome.acked:
                return None
            if item.broker_payload.delivery.lane is not None:
                return None
            fanned_out += outcome.acked
        queued = [item.broker_payload.delivery for item in batch]
        for delivery in queued:
            delivery.message = ACK_QUEUED
        full = self._acks.put(queued)
        window = self.credits
        window.release(len(batch))
        self.metrics.acks_queued(len(batch), fanned_out, window.in_flight)
        backoff = self._backoff
        if backoff.delay:
            backoff.someone_subscribed()
        return full

    async def _send_acks(self, deliveries: list[Delivery[Handle]]) -> None:
        """Send one coalesced ACK batch; the leases are kept until it is on the wire."""
        assert self._leases is not None
        leases = [d.lease for d in deliveries]
        try:
            async with self._leases.settling(leases):
                await self.ack(deliveries)
        finally:
            leased = self._leased
            for lease in leases:
                leased.pop(lease, None)

    def _raise_ack_error(self) -> None:
        """Raise (once) the failure of an ACK batch sent in the background."""
        error, self._acks.error = self._acks.error, None
        assert error is not None
        raise error

    def plan_settlement(
        self, batch: Sequence[AdvanceItem], held: list[Delivery[Handle]] | None = None
    ) -> dict[Settlement, list[Any]]:
        """
        Decide each message's settlement, holding ordered lanes back behind a redelivery.

        Returns deliveries for ACK and REDELIVER and :class:`DeadLetter` letters for DEAD_LETTER.
        With ``held`` given, a message no watcher has seen goes there instead of REDELIVER, and
        so do the later messages of its ordered lane that are held back behind it.
        """
        plan: dict[Settlement, list[Any]] = {
            Settlement.ACK: [],
            Settlement.REDELIVER: [],
            Settlement.DEAD_LETTER: [],
        }
        holding = held is not None
        for item in batch:
            payload: InFlight[Handle] = item.broker_payload
            delivery = payload.delivery
            lane = delivery.lane
            settlement = decide(item.outcome)
            keep = (
                holding
                and settlement is Settlement.REDELIVER
                and _nobody(item)
                and (lane is None or self.hold_ordered_lanes)
            )
            if lane is not None:
                settlement, keep = self._lanes.settle(payload, settlement, keep, holding)
            if keep:
                assert held is not None
                held.append(delivery)
                continue
            if settlement is Settlement.DEAD_LETTER:
                message = delivery.message
                reason = "unprocessable" if message.unprocessable is not None else "rejected"
                plan[settlement].append(DeadLetter(delivery, reason, message.dead_letter_reason()))
            else:
                plan[settlement].append(delivery)
        return plan

    async def _settle(self, plan: dict[Settlement, list[Any]]) -> None:
        # Dead-letter first: if a copy fails, advance raises before anything of the batch was
        # removed, and the whole batch comes back; ordered lanes never see a later message
        # removed ahead of an earlier one that failed to leave.
        for letters in chunked(
            plan[Settlement.DEAD_LETTER],
            max_count=self.dead_letter_batch_limit,
            max_bytes=self.dead_letter_batch_bytes,
            size=self.dead_letter_size,
        ):
            await self.dead_letter(letters)
        for deliveries in chunked(plan[Settlement.ACK], max_count=self.settle_batch_limit):
            await self.ack(deliveries)
        for deliveries in chunked(plan[Settlement.REDELIVER], max_count=self.settle_batch_limit):
            await self.redeliver(deliveries)
        if not self.locks_lanes and plan[Settlement.REDELIVER]:
            self._lanes.await_head(plan[Settlement.REDELIVER])

    def _finish_tracking(
        self, batch: Sequence[AdvanceItem], keep: Collection[Hashable] = (), credits_kept: int = 0
    ) -> None:
        """
        Always runs: return credits and forget the batch, whether settling worked or not.

        ``keep``: leases whose ACK is queued, or of messages held because nobody saw them; they
        stay known (for renewals). ``credits_kept``: the held ones keep their credits too.
        """
        for item in batch:
            payload: InFlight[Handle] = item.broker_payload
            delivery = payload.delivery
            if delivery.lease not in keep:
                self._leased.pop(delivery.lease, None)
            if delivery.lane is not None:
                self._lanes.finished(delivery.lane, payload.sequence)
        self.credits.release(len(batch) - credits_kept)
        self.metrics.gauge(m.IN_FLIGHT, self.credits.in_flight)
        if self._unseen:
            self._unseen_changed.set()  # a lane's held messages wait for its messages in flight
        else:
            self._lanes.nothing_held()
        if batch and all(_nobody(item) for item in batch):
            self._backoff.nobody_subscribed()
        elif batch:
            self._backoff.someone_subscribed()

    def _count(self, batch: Sequence[AdvanceItem], plan: dict[Settlement, list[Any]]) -> None:
        self.metrics.settled(
            batch,
            acked=len(plan[Settlement.ACK]),
            redelivered=len(plan[Settlement.REDELIVER]),
            dead_lettered=len(plan[Settlement.DEAD_LETTER]),
        )
        log.debug(
            "%s advance: ack=%d redeliver=%d dead_letter=%d",
            self.broker,
            len(plan[Settlement.ACK]),
            len(plan[Settlement.REDELIVER]),
            len(plan[Settlement.DEAD_LETTER]),
        )


def _nobody(item: AdvanceItem) -> bool:
    outcome = item.outcome
    return outcome.acked == 0 and outcome.failed == 0 and outcome.rejected == 0
