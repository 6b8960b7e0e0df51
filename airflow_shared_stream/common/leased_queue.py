"""
The producer template of every leased-queue broker: SQS, Pub/Sub, Service Bus.

A leased queue hands out a message under a lease (SQS visibility timeout, Pub/Sub ack deadline,
Service Bus peek-lock) and expects a settlement before it runs out. The template does the rest
once for all of them, in layers: :mod:`.leased_broker` declares what a broker supplies,
:mod:`.leased_advance` settles what the manager advanced, and this module is the stream: the
receive loop (credits, leases, read-ahead, ordered lanes), offering again the messages no watcher
has seen (:mod:`.unseen`), lag sampling and ``aclose``. A broker subclass supplies only its calls:

=====================  ===================  =====================  ===========================
hook                   SQS                  Pub/Sub                Service Bus
=====================  ===================  =====================  ===========================
``connect``            client, attributes   subscriber client      receiver (sessions: lanes)
``receive(n)``         ReceiveMessage       pull                   receive_messages
``ack``                DeleteMessageBatch   acknowledge            complete_message
``redeliver``          visibility 0         modify_ack_deadline 0  abandon_message
``dead_letter``        send to DLQ, delete  publish then ack, or   dead_letter_message
                                            nack to the policy     (reason, description)
``extend_leases``      visibility N         modify_ack_deadline N  renew_message_lock
``disconnect``         close client         close client           close receiver
=====================  ===================  =====================  ===========================

Messages without a lane are unordered; all messages of one receive call share an advance lane.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import AsyncIterator, Hashable, Sequence

from airflow.triggers.shared_stream import SharedStreamProducer

from airflow_shared_stream.common import metrics as m
from airflow_shared_stream.common.ack_batcher import ACK_FLUSH_TIMEOUT_SECONDS, AckBatcher
from airflow_shared_stream.common.backoff import NoSubscriberBackoff
from airflow_shared_stream.common.delivery import (
    ACK_QUEUED,
    DeadLetter,
    Delivery,
    Handle,
    InFlight,
    ReceivedBatch,
    chunked,
)
from airflow_shared_stream.common.flow_control import ack_timeout_seconds, yield_point
from airflow_shared_stream.common.leased_advance import LeasedQueueAdvance
from airflow_shared_stream.common.leased_broker import LeasedQueueBroker
from airflow_shared_stream.common.leases import LeaseKeeper
from airflow_shared_stream.common.matching import RawMessage
from airflow_shared_stream.common.off_loop import import_off_loop
from airflow_shared_stream.common.read_ahead import ReadAhead
from airflow_shared_stream.common.unseen import configured_hold_seconds, hold_bound

__all__ = [  # re-exported: other modules import them from here
    "ACK_QUEUED",
    "AckBatcher",
    "DeadLetter",
    "Delivery",
    "InFlight",
    "LeasedQueueBroker",
    "LeasedQueueProducer",
    "NoSubscriberBackoff",
    "chunked",
]

log = logging.getLogger(__name__)


class LeasedQueueProducer(LeasedQueueAdvance[Handle], SharedStreamProducer):
    """
    Shared-stream producer for a leased queue; a broker subclass supplies the broker calls
    (:class:`~.leased_broker.LeasedQueueBroker`), :class:`~.leased_advance.LeasedQueueAdvance`
    settles.

    Built by the trigger's ``create_shared_stream_producer`` (no I/O in ``__init__``); connects
    in :meth:`open_stream`. Single event loop, like the manager it serves.
    """

    def __init__(self, *, max_in_flight: int, stream_label: str) -> None:
        super().__init__(max_in_flight=max_in_flight, stream_label=stream_label)
        self._sequences = itertools.count()
        self._receives = itertools.count()
        self._lag_task: asyncio.Task[None] | None = None
        # Where the broker does not lock a lane: the stamp each received batch started at.
        self._receive_starts: dict[int, int] = {}
        self._reads: ReadAhead[ReceivedBatch[Handle]] = ReadAhead(
            self.credits,
            self._receive_batch,
            name=f"shared-stream-receive[{self.broker}]",
        )

    # -- the stream ----------------------------------------------------------------------------

    async def open_stream(self) -> AsyncIterator[tuple[RawMessage, InFlight[Handle]]]:
        await import_off_loop(self.sdk_modules)
        lease_seconds = await self.connect()
        self._leases = LeaseKeeper(
            self._extend,
            lease_seconds=lease_seconds,
            max_hold_seconds=ack_timeout_seconds(),
            batch_size=self.settle_batch_limit,
            calls_in_flight=self.renewals_in_flight,
            on_extended=lambda n: self.metrics.incr(m.LEASE_EXTENSIONS, n),
            on_lost=lambda n: self.metrics.incr(m.LEASE_LOSSES, n),
        )
        self._leases.start()
        self._acks.start()
        wanted = self.unseen_hold_seconds
        self._unseen.hold_seconds = hold_bound(
            configured_hold_seconds() if wanted is None else wanted,
            self.unseen_hold_limit(lease_seconds),
            self.broker,
        )
        self._lag_task = asyncio.create_task(self._sample_lag(), name=f"shared-stream-lag[{self.broker}]")
        # When the stream ends, the receives still in flight are left to aclose, which gives
        # back what the stream holds before it cancels them.
        lanes = self._lanes
        while True:
            if self._acks.error is not None:
                self._raise_ack_error()
            if self._unseen.waiting:
                # Offered again, not received again: no delivery attempt is spent on them.
                offered = await self._offer_unseen_again()
                lane = ("receive", next(self._receives))
                for delivery in offered:
                    if delivery.lane is None:
                        yield delivery.message, InFlight(delivery, next(self._sequences), lane)
                    else:
                        yield delivery.message, lanes.track(delivery, next(self._sequences))
                    await yield_point()
                continue
            self._start_receives()
            stamp, deliveries = await self._next_received()
            started = self._receive_starts.pop(id(deliveries), stamp)
            # A receive read ahead before the advance that found nobody subscribed did not wait
            # for the backoff: what it brought waits here instead. Its leases count towards the
            # ack timeout from the fan-out, as Airflow counts the events' (the pause can be longer).
            await self._backoff.wait()
            self._leases.hold_afresh(d.lease for d in deliveries)
            self._start_receives()  # read ahead: the next round trips overlap this fan-out
            receive_lane = ("receive", next(self._receives))
            sequences = self._sequences
            for delivery in deliveries:
                if delivery.lane is None:  # unordered: the one allocation per message, inline
                    yield delivery.message, InFlight(delivery, next(sequences), receive_lane)
                elif (
                    lanes.redelivered_since(delivery.lane, stamp)
                    or lanes.head_held(delivery.lane)
                    or (not self.locks_lanes and lanes.ahead_of_redelivery(delivery, started))
                ):
                    # Behind a redelivery of its lane, or behind its lane's held head (a broker
                    # that does not lock a lane, Pub/Sub, may hand a later message out meanwhile).
                    await self._hold_back_received(delivery)
                else:
                    yield delivery.message, lanes.track(delivery, next(sequences))
                await yield_point()
            if lanes.stamped and not self._reads.any_done():
                lanes.forget_stamps()  # every batch received so far is handed out

    async def _next_received(self) -> ReceivedBatch[Handle]:
        """
        The batch of the next receive to return (:meth:`.ReadAhead.next`).

        With no receive in flight it waits for credit first. While messages no watcher has seen
        are held no receive starts: it returns an empty batch once one of them waits to be
        offered again.
        """
        while not self._reads:
            if self._unseen.waiting:
                return self._lanes.stamp, ()
            if self._unseen.offered:
                # Offered again: their advance says whether someone saw them (then receive again).
                self._unseen_changed.clear()
                await self._unseen_changed.wait()
                continue
            self.metrics.incr(m.CREDIT_WAITS)
            await self.credits.wait_for_credit()  # woken, too, when a message is held unseen
            self._start_receives()
        return await self._reads.next()

    def _start_receives(self) -> None:
        """Read ahead for the credits free now, unless messages no watcher has seen are held."""
        if not self._unseen:
            self._reads.start(self.receives_in_flight, self.receive_limit)

    async def _receive_batch(self, reserved: int) -> ReceivedBatch[Handle]:
        """
        Receive for ``reserved`` credits.

        The messages hold their credits and leases from the moment the broker hands them over,
        so batches read ahead count against the window; credits not filled are freed at once.
        """
        assert self._leases is not None
        received = 0
        try:
            await self._backoff.wait()
            started = self._lanes.stamp
            deliveries = await self.receive(reserved)
            if not self.locks_lanes and deliveries:
                self._receive_starts[id(deliveries)] = started
            if len(deliveries) > reserved:
                raise RuntimeError(
                    f"{type(self).__name__}.receive returned {len(deliveries)} messages "
                    f"for {reserved} credits"
                )
            received = len(deliveries)
        finally:
            self.credits.receive_reserved(reserved, received)
        received_now = {delivery.lease: delivery for delivery in deliveries}
        self._leased.update(received_now)
        self._leases.hold_all(received_now)  # its keys: the leases
        # Not handed out yet: Airflow does not time them out, and a batch read ahead can wait
        # as long as messages nobody saw are held. The ack timeout counts from the fan-out.
        self._leases.hold_unbounded(received_now)
        if deliveries:
            self.metrics.incr(m.RECEIVED, len(deliveries))
            self.metrics.gauge(m.IN_FLIGHT, self.credits.in_flight)
        return self._lanes.stamp, deliveries

    async def _hold_back_received(self, delivery: Delivery[Handle]) -> None:
        """
        Give back, instead of handing out, a message whose lane had a redelivery since it arrived.

        It is later in its lane than the redelivered message, so it must come back after it;
        held with it if that one is held unseen. Its credit and lease are released whatever the
        broker says.
        """
        assert self._leases is not None
        if self._lanes.head_held(delivery.lane):
            self._lanes.hold_in_place(delivery, next(self._sequences))
            self._unseen.hold([delivery])
            self._leases.hold_unbounded([delivery.lease])
            return
        try:
            async with self._leases.settling([delivery.lease]):
                await self.redeliver([delivery])
        finally:
            self._leased.pop(delivery.lease, None)
            self.credits.release(1)
        self.metrics.incr(m.REDELIVERED, 1)
        log.debug("%s: held back %s behind a redelivery of its lane", self.broker, delivery.message.label)

    def get_advance_lane(self, broker_payload: InFlight[Handle]) -> Hashable:
        return broker_payload.advance_lane

    # -- messages no watcher has seen (:mod:`.unseen`) ---------------------------------------

    async def _offer_unseen_again(self) -> list[Delivery[Handle]]:
        """
        The held messages no watcher has seen, to offer again once the no-subscriber pause is over.

        Those held past the bound go back to the broker (:meth:`give_back`) and those whose lease
        the broker refused or took back meanwhile (:meth:`taken_back`) are dropped (it redelivers
        them): both return their credits, and with nothing left held the stream receives again.
        """
        assert self._leases is not None
        await self._backoff.wait()
        # A lane is offered again (or given back) whole, once none of it is in flight any more.
        offer, expired = self._unseen.take(ready=lambda d: self._lanes.idle(d.lane), lane=lambda d: d.lane)
        self._lanes.in_order(offer, expired)
        # Offering a message the broker took back would hand it out twice: the broker redelivers it.
        lost = [d for d in offer if d.lease not in self._leases or self.taken_back(d)]
        if lost:
            gone = {d.lease for d in lost}
            offer = [d for d in offer if d.lease not in gone]
            self._unseen.forget(gone)
            self._leases.forget(gone)
            self._drop_held(lost)
        if expired:
            log.warning(
                "%s: giving back %d message(s) no watcher has seen in %.0fs",
                self.broker,
                len(expired),
                self._unseen.hold_seconds,
            )
            try:
                async with self._leases.settling(d.lease for d in expired):
                    await self.give_back(expired)
                if not self.locks_lanes:
                    self._lanes.await_head(expired)
            finally:
                self._drop_held(expired)
            self.metrics.incr(m.REDELIVERED, len(expired))
        self._leases.hold_afresh(d.lease for d in offer)
        if not offer and not expired and not lost:
            # Every held lane still has messages in flight: wait for their advances.
            self._unseen_changed.clear()
            await self._unseen_changed.wait()
        return offer

    def _drop_held(self, deliveries: Sequence[Delivery[Handle]]) -> None:
        """Forget held messages that left the stream outside an advance; return their credits."""
        for delivery in deliveries:
            self._leased.pop(delivery.lease, None)
        self.credits.release(len(deliveries))
        self.metrics.gauge(m.IN_FLIGHT, self.credits.in_flight)

    async def _extend(self, leases: list[Hashable], seconds: float) -> list[Hashable]:
        deliveries = [self._leased[lease] for lease in leases if lease in self._leased]
        lost = await self.extend_leases(deliveries, seconds) if deliveries else None
        return [delivery.lease for delivery in lost or ()]

    async def _sample_lag(self) -> None:
        while True:
            try:
                lag = await self.broker_lag()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.debug("Sampling %s broker lag failed: %s", self.broker, type(exc).__name__)
                lag = None
            if lag is None and type(self).broker_lag is LeasedQueueProducer.broker_lag:
                return  # the broker does not report lag
            if lag is not None:
                self.metrics.gauge(m.BROKER_LAG, lag)
            await asyncio.sleep(self.lag_interval_seconds)

    # -- shutdown --------------------------------------------------------------------------

    @property
    def in_flight(self) -> int:
        return self.credits.in_flight

    def held_deliveries(self) -> list[Delivery[Handle]]:
        """Messages received and not yet settled (for tests and for shutdown)."""
        return list(self._leased.values())

    async def aclose(self) -> None:
        """
        Send the queued ACKs, give back what was not settled, stop renewing, close the client.

        Queued ACKs first: they are messages the manager advanced, so giving one back before its
        ACK would hand a finished message to the next stream.
        """
        if self._lag_task is not None:
            self._lag_task.cancel()
            await asyncio.gather(self._lag_task, return_exceptions=True)
            self._lag_task = None
        if self._leases is not None and len(self._acks):
            try:
                await asyncio.wait_for(self._acks.drain(), ACK_FLUSH_TIMEOUT_SECONDS)
            except Exception as exc:
                log.warning(
                    "Sending %d queued ACK(s) on close failed (%s); the broker will redeliver them",
                    len(self._acks),
                    type(exc).__name__,
                )
        await self._acks.stop()  # after the drain: nothing is left to send, unless it timed out
        if self._leases is not None:
            # Give back what the stream holds while its receives are still in flight, let them
            # return (up to receive_wait_on_close), give back what they brought, then cancel the
            # rest: Google's Pub/Sub emulator hands a message given back after a pull was
            # cancelled to that dead pull, leased for the whole ack deadline. Where a receive
            # would take what is given back and count it (receives_take_given_back), the
            # receives return first.
            if self.receives_take_given_back and self.held_deliveries():
                await self._reads.stop(wait=self.receive_wait_on_close)
            released = await self._release_held(set())
            await self._reads.stop(wait=self.receive_wait_on_close if released else 0.0)
            await self._release_held(released)
            await self._leases.stop()
        else:
            await self._reads.stop()
        await self.disconnect()
        self.metrics.flush()  # what was counted since the last interval

    async def _release_held(self, already: set[Hashable]) -> set[Hashable]:
        """
        Give back (best effort) the held messages not advanced to an ACK and not in ``already``.

        Returns the leases given back so far: ``already`` and these.
        """
        assert self._leases is not None
        still_acking = {d.lease for d in self._acks.queued}
        unsettled = [
            d for d in self.held_deliveries() if d.lease not in still_acking and d.lease not in already
        ]
        if not unsettled:
            return already
        try:
            async with self._leases.settling(d.lease for d in unsettled):
                await self.release_unsettled(unsettled)
        except Exception as exc:  # best effort: their leases run out instead
            log.warning(
                "Could not give %d unsettled message(s) of %s back on close (%s); the broker "
                "redelivers them when their leases run out",
                len(unsettled),
                self.broker,
                type(exc).__name__,
            )
        return already | {d.lease for d in unsettled}
