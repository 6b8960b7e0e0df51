"""
The producer template of every leased-queue broker: SQS, Pub/Sub, Service Bus.

A leased queue hands a consumer a message under a lease (SQS visibility timeout, Pub/Sub ack
deadline, Service Bus peek-lock) and expects one of three settlements before the lease runs out.
Everything between the broker and Airflow's shared-stream manager is the same for all of them
and lives here, once:

* the receive loop: wait for credit (:class:`~.flow_control.CreditWindow`), fetch at most the
  free credits, hold each lease (:class:`~.leases.LeaseKeeper`), yield, give subscribers a turn;
* ``advance``: split the batch by settlement (one decision table, :mod:`.settlement`), hold back
  later messages of an ordered lane behind a redelivered one, settle inside the lease keeper in
  chunks bounded by count and bytes, always return the credits;
* keep a message no watcher has seen (nobody was in the fan-out: every watcher gone, or stuck and
  left out by the manager) rather than give it back, where each round trip would spend one of the
  broker's delivery attempts and end in its dead-letter queue: its lease stays renewed, it is
  offered again after a pause that doubles up to five seconds, and nothing new is received while
  any such message is held, for at most the ack timeout (:mod:`.unseen`); on an ordered lane the
  later messages of the lane are held with it and the lane is offered again in its order;
* metrics (:mod:`.metrics`) and ``aclose``.

A broker subclass supplies only its calls, in the broker's own vocabulary:

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

Ordered lanes (SQS FIFO ``MessageGroupId``, Pub/Sub ``ordering_key``, Service Bus
``session_id``): when a message of a lane is redelivered, every later message of that lane that
is still in flight is redelivered too, whatever its own outcome, so the broker hands the lane
back in its original order (issue 7 item 11). Messages without a lane are unordered; all
messages of one receive call share an advance lane.

ACKs of unordered messages are coalesced across advances (:class:`AckBatcher`). The manager
advances each lane's contiguous prefix as soon as its trigger events are persisted, so with
several watchers and persistence rounds of varying length one receive lane of ten is advanced
in two or three pieces; acking each piece on its own cost SQS 2.4 DeleteMessageBatch calls per
ten messages (bench/results/sqs_lanes.md). The batcher sends the ACKs once a batch is full,
once no other message is in flight (nothing more could join the batch), or
``ack_linger_seconds`` after the first one waited, whichever comes first,
the way the Kafka committer coalesces commits. A batch is sent in the background (a few at
once, ``ACK_SENDS_IN_FLIGHT``), so ``advance`` returns and the credits come back without
waiting for the broker's round trip. An ACK is only ever queued by ``advance``, so nothing is
acked before the manager advanced it; the lease of a queued message is kept until its ACK is on
the wire; a failed send is raised from the next advance; ``aclose`` sends what is queued and
waits for what is on the wire. A batch is full at ``settle_batch_limit`` or at the credit window,
whichever is smaller: one persistence cycle resolves at most a window of messages, so waiting for
more waits for the next cycle and keeps their leases renewed meanwhile. Pub/Sub, whose
acknowledge takes 1,000 ids against a default window of 500, had every ACK wait the whole linger
once receives were read ahead (something is always in flight then). Ordered lanes are
acked at once: the broker holds the rest of a FIFO group back until its in-flight messages are
deleted, so lingering would stall the lane.
"""

from __future__ import annotations

import abc
import asyncio
import collections
import itertools
import logging
import time
from collections.abc import (
    AsyncIterator,
    Callable,
    Collection,
    Coroutine,
    Hashable,
    Iterable,
    Iterator,
    Sequence,
)
from dataclasses import dataclass
from typing import Any, ClassVar, Generic, TypeVar

from airflow.triggers.shared_stream import AdvanceItem, SharedStreamProducer

from airflow_shared_stream.common import metrics as m
from airflow_shared_stream.common.flow_control import CreditWindow, ack_timeout_seconds, yield_point
from airflow_shared_stream.common.leases import RENEWALS_IN_FLIGHT, LeaseKeeper
from airflow_shared_stream.common.matching import RawMessage
from airflow_shared_stream.common.metrics import StreamMetrics
from airflow_shared_stream.common.settlement import Settlement, decide
from airflow_shared_stream.common.unseen import UnseenMessages

log = logging.getLogger(__name__)

Handle = TypeVar("Handle")
"""What the broker settles a message with: a receipt handle, an ack id, a received message."""

ACK_LINGER_SECONDS = 2.0
"""Longest an ACK waits for others to fill a batch (a message's lease is kept meanwhile).

A batch of ten fills within it from about 5 messages/s up (bench/results/sqs_lanes.md measured
1 s leaving batches of seven at 9 messages/s); faster streams fill batches before it matters,
and an idle stream sends at once (nothing else in flight). The lease keeper keeps renewing
queued messages, so it is safe with any lease; a triggerer that dies meanwhile only means
redelivery, which at-least-once allows."""

ACK_FLUSH_TIMEOUT_SECONDS = 10.0
"""How long ``aclose`` waits for the ACKs still queued or on the wire (then the broker redelivers
them)."""

ACK_SENDS_IN_FLIGHT = 4
"""Most ACK batches on the wire at once per stream (each at most ``settle_batch_limit``).

An ACK batch is sent in the background, so the advance that filled it returns, its credits come
back and the next receive goes out while the broker confirms it; on Service Bus, whose SDK
awaited each round of settlement outcomes for up to 0.2 s behind a pending receive (see
:mod:`airflow_shared_stream.servicebus.producer`), that round trip set the stream's pace when
batches went out one after another inside ``advance``. A broker may lower it
(``LeasedQueueProducer.ack_sends_in_flight``; Service Bus sends one at a time). Bounded, because a
message whose ACK is queued or on the wire no longer holds a credit: when this many batches are
in flight, the advance that fills the next one waits for one of them to finish, so at most
``ACK_SENDS_IN_FLIGHT * settle_batch_limit`` messages (plus one partial batch) wait for their ACK
beyond the credit window, and the manager is slowed down rather than memory growing."""

ACK_QUEUED = RawMessage(envelope={}, label="(message acknowledged, ACK queued)")
"""The message of every delivery whose ACK is queued, in place of its own (both paths of
:meth:`LeasedQueueProducer.advance` set it).

Its trigger events are persisted by then, and an ACK needs only the handle and the lease. A
queued ACK waits up to ``ack_linger_seconds``, and at thousands of messages a second that is
thousands of envelopes (each a few container objects) outliving two garbage-collector
generations: the template paid full collections of the triggerer's whole heap for them, a fifth
of its time at one watcher. Set in place, not on a copy: the manager is done with the delivery
once it advanced it, and the lease keeper's map already holds this object. Shared; nothing reads
or changes it."""

NO_SUBSCRIBER_BACKOFF_MIN = 0.25
NO_SUBSCRIBER_BACKOFF_MAX = 5.0
"""Pauses after a batch nobody was subscribed to, before its messages are offered again (and
before receiving): doubling from MIN up to MAX seconds."""


@dataclass(slots=True, eq=False)
class Delivery(Generic[Handle]):
    """
    One message a broker's :meth:`LeasedQueueProducer.receive` returns.

    :param message: what the watchers see, built with :func:`~.matching.build_message`.
    :param handle: what the broker's settlement calls need (receipt handle, ack id, message).
    :param lease: hashable id the lease keeper tracks (receipt handle, ack id, lock token).
    :param lane: ordering key (FIFO group, ordering key, session id), or ``None`` if unordered.
    :param size: body size in bytes as the broker counts it (dead-letter batches are bounded).
    :param message_id: secret-free id for logs and errors.

    Not declared ``frozen``: a frozen dataclass sets each field through ``object.__setattr__``,
    which made its construction cost about twice as much (1.4 µs against 0.6 µs here), and the
    template replaces the message of a delivery whose ACK it queues with :data:`ACK_QUEUED`;
    nothing else changes a delivery. The brokers' handle classes are not frozen for the same
    reason.
    """

    message: RawMessage
    handle: Handle
    lease: Hashable
    lane: Hashable | None = None
    size: int = 0
    message_id: str = ""


@dataclass(frozen=True, slots=True)
class DeadLetter(Generic[Handle]):
    """
    A message to dead-letter, with why.

    ``reason`` is ``"rejected"`` (a watcher's ``reject`` matched, or its expression failed) or
    ``"unprocessable"`` (undecodable, over ``max_payload_bytes``); ``description`` says which
    watcher or which cause, in one line. Service Bus writes both on the message; SQS and
    Pub/Sub carry them as attributes of the dead-letter copy.
    """

    delivery: Delivery[Handle]
    reason: str
    description: str


@dataclass(eq=False, slots=True)
class InFlight(Generic[Handle]):
    """The broker payload the base yields to the manager with each message (internal)."""

    delivery: Delivery[Handle]
    sequence: int
    advance_lane: Hashable


ReceivedBatch = tuple[int, Sequence[Delivery[Handle]]]
"""What one receive brought, stamped with the count of lane redeliveries when it returned."""


def chunked(
    items: Sequence[Any],
    *,
    max_count: int | None,
    max_bytes: int | None = None,
    size: Callable[[Any], int] = lambda item: 0,
) -> Iterator[list[Any]]:
    """
    Split ``items`` into batches of at most ``max_count`` items and ``max_bytes`` bytes.

    Order is kept. An item larger than ``max_bytes`` on its own gets a batch of its own (the
    broker decides what to do with it); it never makes a batch exceed the limit with others.
    """
    batch: list[Any] = []
    batch_bytes = 0
    for item in items:
        item_bytes = size(item)
        full = max_count is not None and len(batch) >= max_count
        too_big = max_bytes is not None and batch and batch_bytes + item_bytes > max_bytes
        if full or too_big:
            yield batch
            batch, batch_bytes = [], 0
        batch.append(item)
        batch_bytes += item_bytes
    if batch:
        yield batch


class NoSubscriberBackoff:
    """Pause receiving after batches that nobody was subscribed to; reset once someone is."""

    def __init__(
        self,
        minimum: float = NO_SUBSCRIBER_BACKOFF_MIN,
        maximum: float = NO_SUBSCRIBER_BACKOFF_MAX,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.minimum, self.maximum = minimum, maximum
        self._clock = clock
        self.delay = 0.0
        """The pause now in force, 0 when someone was subscribed last (read it; the methods set
        it). An attribute, not a property: every ACK-only advance reads it."""
        self._resume_at = 0.0

    def nobody_subscribed(self) -> None:
        self.delay = min(self.maximum, max(self.minimum, self.delay * 2))
        self._resume_at = self._clock() + self.delay

    def someone_subscribed(self) -> None:
        self.delay = 0.0
        self._resume_at = 0.0

    async def wait(self) -> None:
        remaining = self._resume_at - self._clock()
        if remaining > 0:
            await asyncio.sleep(remaining)


class AckBatcher(Generic[Handle]):
    """
    Coalesce ACKs from many advances into full broker batches, sent in the background.

    ``send`` settles one batch (at most ``batch_limit`` deliveries). A batch is started as soon
    as it fills (in :meth:`add`), and whatever is queued is started ``linger`` seconds after the
    first delivery of a round was queued, or at once by :meth:`flush`. Each send runs as a task
    of its own, at most ``max_sending`` at once: :meth:`add` and :meth:`flush` wait for a free
    slot, never for the send they start, so an advance does not wait for the broker's round trip
    unless ``max_sending`` batches are already on the wire.

    At-least-once is kept by the caller's ``send`` and by the order of events: a delivery is
    only ever queued by an advance (the manager advanced it), ``send`` keeps its lease until the
    ACK is on the wire, and :meth:`drain` (``aclose``) starts what is queued and waits for every
    send. A failed send is kept in :attr:`error` (the first one): the producer raises it from its
    next advance or receive, so the stream fails as it would have had the ACK been sent inline,
    and the messages of that batch come back when their leases run out.
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


class LeasedQueueProducer(SharedStreamProducer, Generic[Handle], abc.ABC):
    """
    Shared-stream producer for a leased queue; a broker subclass supplies the broker calls.

    Built by the trigger's ``create_shared_stream_producer`` (no I/O in ``__init__``); connects
    in :meth:`open_stream`. Single event loop, like the manager it serves.

    Class attributes a broker sets:

    * ``broker``: short name, used in metric names.
    * ``receive_limit``: most messages one ``receive`` call may ask for (SQS: 10).
    * ``settle_batch_limit``: most messages per ack / redeliver / extend call.
    * ``dead_letter_batch_limit`` and ``dead_letter_batch_bytes``: bounds of one dead-letter
      call; a message larger than the byte bound is passed alone.
    * ``lag_interval_seconds``: how often :meth:`broker_lag` is sampled (if implemented).
    * ``ack_linger_seconds``: longest an unordered ACK waits for a full batch (0: ack inline).
    * ``ack_sends_in_flight``: most ACK batches sent in the background at once.
    * ``renewals_in_flight``: most lease-extension calls of one renewal pass at once (1 where the
      SDK cannot take concurrent calls on one receiver: Service Bus).
    * ``receives_in_flight``: most receive calls in flight at once (1: one receive, read ahead
      while the previous batch is fanned out). More pays where a receive's round trip, not the
      fan-out, sets the pace and the broker hands out less than the window per call (Pub/Sub).
      Batches are then yielded as their receives return, so a broker sets it to 1 on a stream
      with ordered lanes (an instance attribute set in ``connect`` will do).
    """

    broker: ClassVar[str] = "leased_queue"
    receive_limit: ClassVar[int | None] = None
    settle_batch_limit: ClassVar[int | None] = None
    dead_letter_batch_limit: ClassVar[int | None] = None
    dead_letter_batch_bytes: ClassVar[int | None] = None
    lag_interval_seconds: ClassVar[float] = 30.0
    ack_linger_seconds: ClassVar[float] = ACK_LINGER_SECONDS
    ack_sends_in_flight: ClassVar[int] = ACK_SENDS_IN_FLIGHT
    renewals_in_flight: ClassVar[int] = RENEWALS_IN_FLIGHT
    receives_in_flight: int = 1  # not a ClassVar: a stream may lower it in connect()
    receive_wait_on_close: float = 0.0
    """How long ``aclose`` lets the receives in flight return, when it gave messages back, before
    it cancels them (a broker that gives messages back on close sets it to its long-poll wait)."""
    hold_ordered_lanes: ClassVar[bool] = True
    """Hold an ordered lane's messages that reached nobody too (:mod:`.unseen`). Only for a broker
    that hands out nothing of a lane while an earlier message of it is out or on its way back
    (an SQS FIFO group, a Service Bus session); else a later message can arrive ahead of an
    earlier one being redelivered, and holding it would keep that order."""
    unseen_hold_seconds: float | None = None
    """Longest a message no watcher has seen is held (:mod:`.unseen`); ``None``: the triggerer's
    ``shared_stream_ack_timeout``."""

    def __init__(self, *, max_in_flight: int, stream_label: str) -> None:
        self._window = CreditWindow(max_in_flight)
        self.metrics = StreamMetrics(self.broker, stream_label)
        self._backoff = NoSubscriberBackoff()
        self._leases: LeaseKeeper[Hashable] | None = None
        self._leased: dict[Hashable, Delivery[Handle]] = {}
        self._sequences = itertools.count()
        self._receives = itertools.count()
        # Ordered lanes: sequences in flight per lane, and the sequences held back behind a
        # redelivery (settled REDELIVER whatever their own outcome).
        self._lane_in_flight: dict[Hashable, set[int]] = {}
        self._held_back: set[int] = set()
        # Ordered lanes: the count of lane redeliveries so far, and the count at each lane's
        # last one; a received batch is stamped with the count when its receive returned, so
        # a message received before its lane's redelivery (not yet handed out) is held back too.
        self._lane_redeliveries = 0
        self._redelivered_lanes: dict[Hashable, int] = {}
        self._lag_task: asyncio.Task[None] | None = None
        self._receiving: collections.deque[asyncio.Task[ReceivedBatch[Handle]]] = collections.deque()
        """Receives in flight, oldest first."""
        self._acks: AckBatcher[Handle] = AckBatcher(
            self._send_acks,
            batch_limit=min(self.settle_batch_limit or max_in_flight, max_in_flight),
            linger=self.ack_linger_seconds,
            max_sending=self.ack_sends_in_flight,
        )
        # Messages no watcher has seen, kept with their credits and leases (never given back to
        # spend a delivery attempt); the bound is set when the stream opens.
        self._unseen: UnseenMessages[Delivery[Handle]] = UnseenMessages(hold_seconds=0.0)
        self._unseen_changed = asyncio.Event()
        # Ordered lanes whose latest held-back head reached nobody: their later messages are held
        # too (not redelivered), and each held message's place in its lane, to offer them again
        # in order.
        self._held_lanes: set[Hashable] = set()
        self._held_order: dict[Hashable, int] = {}

    # -- what a broker supplies ---------------------------------------------------------------

    @abc.abstractmethod
    async def connect(self) -> float:
        """Open the broker client, check the upstream exists; return the lease each extension grants (s)."""

    @abc.abstractmethod
    async def receive(self, max_messages: int) -> Sequence[Delivery[Handle]]:
        """One receive call (long-poll if the broker has it) returning at most ``max_messages``."""

    @abc.abstractmethod
    async def ack(self, deliveries: Sequence[Delivery[Handle]]) -> None:
        """Settle ACK: the message is done (delete / acknowledge / complete)."""

    @abc.abstractmethod
    async def redeliver(self, deliveries: Sequence[Delivery[Handle]]) -> None:
        """Settle REDELIVER: give the message back at once (visibility 0 / nack / abandon)."""

    @abc.abstractmethod
    async def dead_letter(self, letters: Sequence[DeadLetter[Handle]]) -> None:
        """
        Settle DEAD-LETTER: copy to the dead-letter destination, and only once the copy is
        acknowledged, remove from the source. Raise if a copy fails (the group fails and the
        broker redelivers); never remove a message whose copy was not acknowledged.
        """

    @abc.abstractmethod
    async def extend_leases(
        self, deliveries: Sequence[Delivery[Handle]], seconds: float
    ) -> Collection[Delivery[Handle]] | None:
        """Extend each lease to ``seconds`` from now; return the ones the broker refused (lost)."""

    @abc.abstractmethod
    async def disconnect(self) -> None:
        """Close the broker client (best effort)."""

    async def broker_lag(self) -> int | None:
        """Messages waiting on the broker, if it reports it (for the ``broker_lag`` gauge)."""
        return None

    def dead_letter_size(self, letter: DeadLetter[Handle]) -> int:
        """Bytes a dead-letter copy takes in a batch; the body size unless the broker adds more."""
        return letter.delivery.size

    async def give_back(self, deliveries: Sequence[Delivery[Handle]]) -> None:
        """
        Return messages no watcher has seen, held past the bound, to the broker (default: redeliver).

        A broker with an outcome that does not count as a delivery attempt uses it here (Service
        Bus: AMQP ``released``). SQS counts every receive and Pub/Sub every redelivery, so there
        it is the redelivery, one attempt per bound.
        """
        await self.redeliver(deliveries)

    # -- the stream ----------------------------------------------------------------------------

    async def open_stream(self) -> AsyncIterator[tuple[RawMessage, InFlight[Handle]]]:
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
        hold = self.unseen_hold_seconds
        self._unseen.hold_seconds = hold if hold is not None else ack_timeout_seconds()
        self._lag_task = asyncio.create_task(self._sample_lag(), name=f"shared-stream-lag[{self.broker}]")
        # When the stream ends, the receives still in flight are left to aclose, which gives
        # back what the stream holds before it cancels them.
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
                        yield delivery.message, self._track_on_lane(delivery, delivery.lane)
                    await yield_point()
                continue
            self._start_receives()
            stamp, deliveries = await self._next_received()
            # A receive read ahead was started before the advance that found nobody subscribed,
            # so it did not wait for the backoff; what it brought (often the very message just
            # given back) waits here instead, and no receive starts meanwhile.
            await self._backoff.wait()
            # Read ahead: the next receives' round trips overlap the fan-out of this batch.
            self._start_receives()
            receive_lane = ("receive", next(self._receives))
            sequences = self._sequences
            for delivery in deliveries:
                if delivery.lane is None:  # unordered: the one allocation per message, inline
                    yield delivery.message, InFlight(delivery, next(sequences), receive_lane)
                elif self._redelivered_lanes.get(delivery.lane, -1) > stamp:
                    await self._hold_back_received(delivery)
                else:
                    yield delivery.message, self._track_on_lane(delivery, delivery.lane)
                await yield_point()
            if self._redelivered_lanes and not any(task.done() for task in self._receiving):
                # Every batch received so far is handed out; the next are stamped after every
                # redelivery recorded here.
                self._redelivered_lanes.clear()

    async def _next_received(self) -> ReceivedBatch[Handle]:
        """
        The batch of the first receive to return (the oldest first when several have).

        With nothing in flight (no credit was free to start a receive) it waits for credit
        first. With one receive in flight that is simply it. With several, a receive the broker
        holds open (a long poll with nothing for it) does not hold back batches the others
        already got, which is why ``receives_in_flight`` above one is only for streams whose
        batches may be yielded in the order they arrive (no ordered lanes).

        While messages no watcher has seen are held, no receive starts: with none in flight it
        returns an empty batch as soon as one of them waits to be offered again.
        """
        while not self._receiving:
            if self._unseen.waiting:
                return self._lane_redeliveries, ()
            if self._unseen.offered:
                # Offered again: their advance says whether someone saw them (then receive again).
                self._unseen_changed.clear()
                await self._unseen_changed.wait()
                continue
            self.metrics.incr(m.CREDIT_WAITS)
            await self._window.wait_for_credit()  # woken, too, when a message is held unseen
            self._start_receives()
        # asyncio.wait, not ``await task``: a stream cancelled here must not cancel the receives
        # (aclose does, after giving back what the stream holds).
        await asyncio.wait(self._receiving, return_when=asyncio.FIRST_COMPLETED)
        done = next(task for task in self._receiving if task.done())
        deliveries = done.result()
        self._receiving.remove(done)
        return deliveries

    def _start_receives(self) -> None:
        """
        Start receives, up to ``receives_in_flight``, for the credits free right now.

        Each reserves its credits as it starts, so none ever waits for credit while others
        hold credits in messages not yet yielded: the window cannot deadlock. Each asks for at
        most its share of the window (``max_in_flight // receives_in_flight``), so one receive
        does not take every credit and leave the others nothing to ask for. None starts while
        messages no watcher has seen are held: the stream takes nothing new that would reach
        nobody too.
        """
        if self._unseen:
            return
        while len(self._receiving) < self.receives_in_flight:
            credits = min(self._window.available, self._receive_size())
            if credits <= 0:
                return
            self._window.reserve(credits)
            name = f"shared-stream-receive[{self.broker}]"
            self._receiving.append(asyncio.create_task(self._receive_batch(credits), name=name))

    def _receive_size(self) -> int:
        """Most messages one receive call asks for: the broker's limit and this call's share of the window."""
        share = max(1, self._window.max_in_flight // self.receives_in_flight)
        return min(share, self.receive_limit) if self.receive_limit else share

    async def _stop_receiving(self, wait: float = 0.0) -> None:
        """
        Stop the receives read ahead, after letting them return for up to ``wait`` seconds; what
        they got is held, and ``aclose`` gives it back.
        """
        receiving = list(self._receiving)
        if receiving and wait > 0:
            await asyncio.wait(receiving, timeout=wait)
        self._receiving.clear()
        for task in receiving:
            task.cancel()
        await asyncio.gather(*receiving, return_exceptions=True)

    async def _receive_batch(self, reserved: int) -> ReceivedBatch[Handle]:
        """
        Receive for ``reserved`` credits (reserved by :meth:`_start_receives`).

        The messages hold their credits and leases from the moment the broker hands them over,
        not from when they are yielded, so batches read ahead (while an earlier one is still
        being yielded) count against the window and never hold more than ``max_in_flight``
        unsettled messages; credits a receive reserved and did not fill are freed at once.
        """
        assert self._leases is not None
        received = 0
        try:
            await self._backoff.wait()
            deliveries = await self.receive(reserved)
            if len(deliveries) > reserved:
                raise RuntimeError(
                    f"{type(self).__name__}.receive returned {len(deliveries)} messages "
                    f"for {reserved} credits"
                )
            received = len(deliveries)
        finally:
            self._window.receive_reserved(reserved, received)
        received_now = {delivery.lease: delivery for delivery in deliveries}
        self._leased.update(received_now)
        self._leases.hold_all(received_now)  # its keys: the leases
        if deliveries:
            self.metrics.incr(m.RECEIVED, len(deliveries))
            self.metrics.gauge(m.IN_FLIGHT, self._window.in_flight)
        return self._lane_redeliveries, deliveries

    async def _hold_back_received(self, delivery: Delivery[Handle]) -> None:
        """
        Give back, instead of handing out, a message whose lane had a redelivery since it arrived.

        It is later in its lane than the redelivered message (everything earlier was handed
        out before it), so it must come back after it, like the lane's messages in flight
        (:meth:`plan_settlement`). Its credit and lease are released whatever the broker says.
        """
        assert self._leases is not None
        if delivery.lane in self._held_lanes:
            # Its lane's head reached nobody and is held: it waits behind it, in its place.
            self._held_order[delivery.lease] = next(self._sequences)
            self._unseen.hold([delivery])
            self._leases.hold_unbounded([delivery.lease])
            return
        try:
            async with self._leases.settling([delivery.lease]):
                await self.redeliver([delivery])
        finally:
            self._leased.pop(delivery.lease, None)
            self._window.release(1)
        self.metrics.incr(m.REDELIVERED, 1)
        log.debug("%s: held back %s behind a redelivery of its lane", self.broker, delivery.message.label)

    def _track_on_lane(self, delivery: Delivery[Handle], lane: Hashable) -> InFlight[Handle]:
        """The payload of a message on an ordered lane, tracked per lane (unordered: inline above)."""
        sequence = next(self._sequences)
        self._lane_in_flight.setdefault(lane, set()).add(sequence)
        return InFlight(delivery, sequence, ("lane", lane))

    def get_advance_lane(self, broker_payload: InFlight[Handle]) -> Hashable:
        return broker_payload.advance_lane

    async def _offer_unseen_again(self) -> list[Delivery[Handle]]:
        """
        The held messages no watcher has seen, to offer again once the no-subscriber pause is over.

        Those held past the bound go back to the broker (:meth:`give_back`) and those whose lease
        the broker refused meanwhile are dropped (it redelivers them): both return their credits,
        and with nothing left held the stream receives again.
        """
        assert self._leases is not None
        await self._backoff.wait()
        # A lane is offered again (or given back) whole, once none of it is in flight any more.
        offer, expired = self._unseen.take(
            ready=lambda d: d.lane is None or d.lane not in self._lane_in_flight,
            lane=lambda d: d.lane,
        )
        order = self._held_order
        if order:
            offer.sort(key=lambda d: order.get(d.lease, -1))
            expired.sort(key=lambda d: order.get(d.lease, -1))
            for delivery in (*offer, *expired):
                order.pop(delivery.lease, None)
            self._held_lanes.difference_update(d.lane for d in expired)
        lost = [d for d in offer if d.lease not in self._leases]
        if lost:
            offer = [d for d in offer if d.lease in self._leases]
            self._unseen.forget(d.lease for d in lost)
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
            finally:
                self._drop_held(expired)
            self.metrics.incr(m.REDELIVERED, len(expired))
        self._leases.hold_afresh(d.lease for d in offer)
        if not offer and not expired:
            # Every held lane still has messages in flight: wait for their advances.
            self._unseen_changed.clear()
            await self._unseen_changed.wait()
        return offer

    def _drop_held(self, deliveries: Sequence[Delivery[Handle]]) -> None:
        """Forget held messages that left the stream outside an advance; return their credits."""
        for delivery in deliveries:
            self._leased.pop(delivery.lease, None)
        self._window.release(len(deliveries))
        self.metrics.gauge(m.IN_FLIGHT, self._window.in_flight)

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
            self._window.wake()

    # -- settlement ------------------------------------------------------------------------

    async def advance(self, batch: Sequence[AdvanceItem]) -> None:
        assert self._leases is not None
        if self._acks.error is not None:
            self._raise_ack_error()
        if self.ack_linger_seconds > 0 and not self._held_back:
            full = self._queue_plain_acks(batch)
            if full is not None:
                # The common advance, inline: no coroutine unless a batch is full or nothing
                # else is in flight (then nothing more could join the queued ACKs).
                if full:
                    await self._acks.send_full()
                if self._window.in_flight == 0:
                    await self._acks.flush()
                return
        later: list[Delivery[Handle]] = []
        held: list[Delivery[Handle]] = []
        try:
            plan = self.plan_settlement(batch, held)
            self._hold_unseen(batch, held)
            acks = plan[Settlement.ACK]
            if self.ack_linger_seconds > 0 and acks:
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
        if self._window.in_flight == 0:
            await self._acks.flush()  # nothing else is in flight: no other ACK could join these
        self._count(batch, plan)

    def _queue_plain_acks(self, batch: Sequence[AdvanceItem]) -> bool | None:
        """
        The common advance on a path of its own: every message ACK, none on an ordered lane.

        Returns ``None``, having changed nothing, when some message of ``batch`` is not such an
        ACK (a failure, a reject, nobody subscribed, an ordered lane; see
        :func:`~.settlement.decide`): the general path decides. Otherwise the same effect as the
        general path when nothing settles inline (every ACK is queued for the ACK batcher), in
        two passes over the batch, without a settlement plan, without a suspension point and
        with as few calls as it takes: the manager advances whatever one persistence
        confirmation completes, often a single message, and at one watcher the general path's
        bookkeeping was most of the template's own cost per message
        (bench/results/instructions.md). Returns True if an ACK batch is full: the caller
        awaits :meth:`AckBatcher.send_full` (whose wait for a free send slot is the
        backpressure on the manager).
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
        window = self._window
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
        """
        Raise (once) the failure of an ACK batch sent in the background.

        Callers look at ``self._acks.error`` first: it is ``None`` on almost every advance, and
        the look costs less than this call.
        """
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
        for item in batch:
            payload: InFlight[Handle] = item.broker_payload
            delivery = payload.delivery
            lane = delivery.lane
            settlement = decide(item.outcome)
            keep = (
                held is not None
                and settlement is Settlement.REDELIVER
                and _nobody(item)
                and (lane is None or self.hold_ordered_lanes)
            )
            if payload.sequence in self._held_back:
                self._held_back.discard(payload.sequence)
                settlement = Settlement.REDELIVER
                keep = held is not None and lane in self._held_lanes  # its lane's head was held
            elif lane is not None and settlement is Settlement.REDELIVER:
                # A new head of its lane: the lane's later messages follow what it got.
                if keep:
                    self._held_lanes.add(lane)
                else:
                    self._held_lanes.discard(lane)
            if settlement is Settlement.REDELIVER and lane is not None:
                later = {s for s in self._lane_in_flight.get(lane, ()) if s > payload.sequence}
                self._held_back |= later
                self._lane_redeliveries += 1
                self._redelivered_lanes[lane] = self._lane_redeliveries
            if keep:
                assert held is not None
                held.append(delivery)
                if lane is not None:
                    self._held_order[delivery.lease] = payload.sequence
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
                lane = self._lane_in_flight.get(delivery.lane)
                if lane is not None:
                    lane.discard(payload.sequence)
                    if not lane:
                        del self._lane_in_flight[delivery.lane]
        self._window.release(len(batch) - credits_kept)
        self.metrics.gauge(m.IN_FLIGHT, self._window.in_flight)
        if self._unseen:
            self._unseen_changed.set()  # a lane's held messages wait for its messages in flight
        elif self._held_lanes:
            self._held_lanes.clear()  # nothing held: no lane has a held head any more
        if batch and all(_nobody(item) for item in batch):
            self._backoff.nobody_subscribed()
        elif batch:
            self._backoff.someone_subscribed()

    def _count(self, batch: Sequence[AdvanceItem], plan: dict[Settlement, list[Any]]) -> None:
        fanned_out = nobody = failed = failed_messages = 0
        for item in batch:  # one pass: this runs once per message at one watcher
            outcome = item.outcome
            resolved = outcome.acked + outcome.failed + outcome.rejected
            fanned_out += resolved
            if resolved == 0:
                nobody += 1
            elif outcome.failed:
                failed += outcome.failed
                failed_messages += 1
        metrics = self.metrics
        metrics.incr(m.ACKED, len(plan[Settlement.ACK]))
        metrics.incr(m.REDELIVERED, len(plan[Settlement.REDELIVER]))
        metrics.incr(m.DEAD_LETTERED, len(plan[Settlement.DEAD_LETTER]))
        metrics.incr(m.NO_SUBSCRIBER, nobody)
        metrics.incr(m.FANNED_OUT, fanned_out)
        metrics.failed_deliveries(failed, failed_messages)
        log.debug(
            "%s advance: ack=%d redeliver=%d dead_letter=%d",
            self.broker,
            len(plan[Settlement.ACK]),
            len(plan[Settlement.REDELIVER]),
            len(plan[Settlement.DEAD_LETTER]),
        )

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
        return self._window.in_flight

    def held_deliveries(self) -> list[Delivery[Handle]]:
        """Messages received and not yet settled (for tests and for shutdown)."""
        return list(self._leased.values())

    async def release_unsettled(self, deliveries: Sequence[Delivery[Handle]]) -> None:
        """
        Give messages nobody settled back to the broker as the stream closes (default: nothing).

        Called by :meth:`aclose` after the queued ACKs were sent, with only the messages that
        were never advanced to an ACK, inside the lease keeper's ``settling`` (no renewal races
        it). Without it their leases run out and the broker redelivers them; a broker whose
        leases may be long (Pub/Sub) gives them back at once instead. Best effort: raise, and
        the lease runs out as without it.
        """

    async def aclose(self) -> None:
        """
        Send the queued ACKs, give back what was not settled, stop renewing, close the client.

        Order matters: a queued ACK is a message the manager advanced (every watcher's event is
        persisted), so it is sent first and is never among the messages given back; giving it
        back before its ACK would hand a finished message to the next stream.
        """
        if self._lag_task is not None:
            self._lag_task.cancel()
            await asyncio.gather(self._lag_task, return_exceptions=True)
            self._lag_task = None
        if self._leases is not None and len(self._acks):
            # Advanced by the manager, so done: send them rather than let them come back.
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
            # return (up to receive_wait_on_close) and give back what they brought, then cancel
            # the rest. Google's Pub/Sub emulator hands a message that is given back after a
            # pull was cancelled to that dead pull until the pull's deadline, leased for the
            # whole ack deadline: given back "at once", it came back a minute later.
            released = await self._release_held(set())
            await self._stop_receiving(wait=self.receive_wait_on_close if released else 0.0)
            await self._release_held(released)
            await self._leases.stop()
        else:
            await self._stop_receiving()
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


def _nobody(item: AdvanceItem) -> bool:
    outcome = item.outcome
    return outcome.acked == 0 and outcome.failed == 0 and outcome.rejected == 0


def deliveries_of(letters: Iterable[DeadLetter[Handle]]) -> list[Delivery[Handle]]:
    """The deliveries behind dead-letter letters, in order (for the broker's remove call)."""
    return [letter.delivery for letter in letters]
