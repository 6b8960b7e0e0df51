"""What a leased-queue broker supplies to the template: its limits and its calls."""

from __future__ import annotations

import abc
from collections.abc import Collection, Sequence
from typing import ClassVar, Generic

from airflow_shared_stream.common.ack_batcher import ACK_LINGER_SECONDS, ACK_SENDS_IN_FLIGHT
from airflow_shared_stream.common.delivery import DeadLetter, Delivery, Handle
from airflow_shared_stream.common.leases import RENEWALS_IN_FLIGHT


class LeasedQueueBroker(Generic[Handle], abc.ABC):
    """
    The broker side of :class:`~.leased_queue.LeasedQueueProducer`, in the broker's vocabulary
    (the table in :mod:`.leased_queue`). Subclass the producer, not this.
    """

    broker: ClassVar[str] = "leased_queue"
    """Short name, used in metric names."""
    sdk_modules: ClassVar[tuple[str, ...]] = ()
    """The broker SDK's modules :meth:`connect` uses: imported in a worker thread before it runs,
    so their first import does not hold the triggerer's event loop (:mod:`.off_loop`)."""
    receive_limit: ClassVar[int | None] = None
    """Most messages one ``receive`` call may ask for (SQS: 10)."""
    settle_batch_limit: ClassVar[int | None] = None
    """Most messages per ack / redeliver / extend call."""
    dead_letter_batch_limit: ClassVar[int | None] = None
    dead_letter_batch_bytes: ClassVar[int | None] = None
    """Bounds of one dead-letter call; a message larger than the byte bound is passed alone."""
    lag_interval_seconds: ClassVar[float] = 30.0
    """How often :meth:`broker_lag` is sampled (if the broker reports lag)."""
    ack_linger_seconds: ClassVar[float] = ACK_LINGER_SECONDS
    """Longest an unordered ACK waits for a full batch (0: ack inline)."""
    ack_sends_in_flight: ClassVar[int] = ACK_SENDS_IN_FLIGHT
    renewals_in_flight: ClassVar[int] = RENEWALS_IN_FLIGHT
    """Most lease-extension calls of one renewal pass at once (1 where the SDK cannot take
    concurrent calls on one receiver: Service Bus)."""
    receives_in_flight: int = 1  # not a ClassVar: a stream may lower it in connect()
    """Most receive calls in flight at once. More pays where a receive's round trip sets the
    pace (Pub/Sub); batches are then yielded as their receives return, so it must be 1 on a
    stream with ordered lanes."""
    receive_wait_on_close: float = 0.0
    """How long ``aclose`` lets the receives in flight return, when it gave messages back, before
    it cancels them (a broker that gives messages back on close sets it to its long-poll wait)."""
    receives_take_given_back: ClassVar[bool] = False
    """A receive in flight takes a message given back meanwhile, and the broker counts that as a
    delivery attempt (an SQS long poll, a Pub/Sub pull on a subscription with a dead-letter
    policy): ``aclose`` then lets the receives return (up to
    ``receive_wait_on_close``) before it gives anything back."""
    hold_ordered_lanes: ClassVar[bool] = True
    """Hold an ordered lane's messages that reached nobody too (:mod:`.unseen`). Where the broker
    does not lock a lane (a Pub/Sub ordering key), nothing is received while messages are held,
    and a later message of a held lane that a receive already in flight brings is held behind
    its head, in its place."""
    locks_lanes: ClassVar[bool] = True
    """The broker hands out nothing of an ordered lane while a message of it is out (an SQS FIFO
    group, a Service Bus session). Pub/Sub does not lock an ordering key: a pull can bring a
    later message of a key it handed out before it took the key's redelivery, so the template
    waits for each redelivered head (:meth:`.LaneTracker.await_head`)."""
    unseen_hold_seconds: float | None = None
    """Longest a message no watcher has seen is held (:mod:`.unseen`); ``None``: the
    ``[shared_stream] unseen_hold_seconds`` option, else the triggerer's ``shared_stream_ack_timeout``."""

    def unseen_hold_limit(self, lease_seconds: float) -> float | None:
        """
        The longest the broker lets a message nobody saw be held by renewing its lease, from the
        first time it reached nobody (``None``: no limit); called once the stream is connected.
        """
        return None

    def taken_back(self, delivery: Delivery[Handle]) -> bool:
        """
        The broker has this message back although no renewal of its lease was refused (default:
        never). Such a message held unseen is dropped, not offered again: the broker redelivers it.
        """
        return False

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
        Bus: AMQP ``released``); on SQS and Pub/Sub it is the redelivery, one attempt per bound.
        """
        await self.redeliver(deliveries)

    async def release_unsettled(self, deliveries: Sequence[Delivery[Handle]]) -> None:
        """
        Give messages nobody settled back to the broker as the stream closes (default: nothing).

        Called by :meth:`aclose` after the queued ACKs were sent, inside the lease keeper's
        ``settling``. Without it their leases run out and the broker redelivers them; a broker
        whose leases may be long (Pub/Sub) gives them back at once. Best effort: may raise.
        """
