"""
Flow control for producers: a credit window bounding the messages in flight.

Airflow's manager never waits for subscribers before fanning out the next raw event, and a
subscriber whose queue fills up (``[triggerer] shared_stream_subscriber_queue_size``, 1024) is
force-failed. Persistence confirmations arrive at the pace of the triggerer's state sync (about
once a second). A producer that yields whatever the
broker hands it therefore overflows subscriber queues on a burst and piles up messages that will
time out and be redelivered.

A :class:`CreditWindow` closes that loop: the producer spends a credit per yielded message and
gets it back when the manager advances the message. While ``max_in_flight`` messages are yielded
but not advanced, the producer waits instead of fetching more. Because a subscriber's queue only
ever holds messages that are in flight, a window no larger than the queue size makes an overflow
impossible.
"""

from __future__ import annotations

import asyncio

from airflow.triggers.shared_stream import DEFAULT_ACK_TIMEOUT, DEFAULT_SUBSCRIBER_QUEUE_MAX

from airflow_shared_stream.common.errors import SharedStreamConfigurationError


def subscriber_queue_size() -> int:
    """The triggerer's per-subscriber queue bound, as configured for this deployment."""
    try:
        from airflow.configuration import conf

        return conf.getint(
            "triggerer", "shared_stream_subscriber_queue_size", fallback=DEFAULT_SUBSCRIBER_QUEUE_MAX
        )
    except Exception:  # pragma: no cover - configuration unreadable outside a deployment
        return DEFAULT_SUBSCRIBER_QUEUE_MAX


def ack_timeout_seconds() -> float:
    """
    The triggerer's per-event ack timeout, as configured for this deployment.

    Past it Airflow fails an unpersisted event and the broker must redeliver it, so it is also
    the longest a lease is worth extending.
    """
    try:
        from airflow.configuration import conf

        return conf.getfloat("triggerer", "shared_stream_ack_timeout", fallback=DEFAULT_ACK_TIMEOUT)
    except Exception:  # pragma: no cover - configuration unreadable outside a deployment
        return DEFAULT_ACK_TIMEOUT


def validate_max_in_flight(max_in_flight: int) -> int:
    """
    Refuse a window that could overflow the triggerer's subscriber queues.

    Raised at trigger construction, so a bad value fails the Dag file's parse with a clear
    message rather than failing watchers at run time.
    """
    if isinstance(max_in_flight, bool) or not isinstance(max_in_flight, int):
        raise SharedStreamConfigurationError(
            f"max_in_flight must be an int, got {type(max_in_flight).__name__}"
        )
    limit = subscriber_queue_size()
    if not 1 <= max_in_flight <= limit:
        raise SharedStreamConfigurationError(
            f"max_in_flight must be between 1 and {limit} "
            "([triggerer] shared_stream_subscriber_queue_size); "
            f"got {max_in_flight}. A larger window could overflow subscriber queues."
        )
    return max_in_flight


class CreditWindow:
    """
    Bound the messages a producer has yielded but the manager has not yet advanced.

    Single-producer, single-event-loop: :meth:`acquire` is called by the producer's stream task
    and :meth:`release` by its ``advance``. Not thread-safe, like the manager it serves.
    """

    def __init__(self, max_in_flight: int) -> None:
        if max_in_flight < 1:
            raise ValueError(f"max_in_flight must be at least 1, got {max_in_flight}")
        self.max_in_flight = max_in_flight
        self.in_flight = 0
        """Credits spent: messages received and not advanced yet. Read it, never set it (the
        methods do); an attribute rather than a property because it is read once per advance."""
        self._reserved = 0
        self._credit_returned = asyncio.Event()
        self._waiters = 0
        """Tasks in :meth:`wait_for_credit`: a release wakes them, and costs no event otherwise."""
        self._woken = False

    @property
    def available(self) -> int:
        """Credits free right now: the most messages worth fetching from the broker."""
        return self.max_in_flight - self.in_flight - self._reserved

    def reserve(self, count: int) -> None:
        """
        Set ``count`` credits aside for a receive call that is about to ask the broker for them.

        Several receives in flight at once each ask for what they reserved, so together they
        never ask for more than the window; :meth:`receive_reserved` settles the reservation.
        """
        if not 0 < count <= self.available:
            raise RuntimeError(f"cannot reserve {count} credit(s) with {self.available} free")
        self._reserved += count

    def receive_reserved(self, reserved: int, received: int) -> None:
        """A receive got ``received`` messages for ``reserved`` credits: spend those, free the rest."""
        if not 0 <= received <= reserved:
            raise RuntimeError(f"{received} message(s) received for {reserved} reserved credit(s)")
        self._reserved -= reserved
        self.in_flight += received
        if received < reserved and self._waiters:
            self._credit_returned.set()

    async def wait_for_credit(self) -> int:
        """Wait until at least one credit is free, or :meth:`wake` is called; return how many are free."""
        self._woken = False
        while self.available <= 0 and not self._woken:
            self._credit_returned.clear()
            self._waiters += 1
            try:
                await self._credit_returned.wait()
            finally:
                self._waiters -= 1
        return self.available

    def wake(self) -> None:
        """
        End the waits of :meth:`wait_for_credit` without returning credit.

        For a producer whose reason to wait changed while every credit stays spent: a message
        the watchers did not see is kept (its credit with it), and the stream must offer it
        again rather than wait for a credit nobody will return.
        """
        self._woken = True
        self._credit_returned.set()

    async def acquire(self) -> None:
        """Spend one credit, waiting for one to be returned if the window is full."""
        await self.wait_for_credit()
        self.in_flight += 1

    def take(self) -> None:
        """
        Spend a credit known to be free, without a suspension point.

        For a producer that sized its fetch by :attr:`available`: the credits are there, and
        skipping the await keeps the per-message path cheap.
        """
        if self.available <= 0:
            raise RuntimeError("credit window is full: size fetches by CreditWindow.available")
        self.in_flight += 1

    def release(self, count: int = 1) -> None:
        """Return credits for messages the manager has advanced (whatever their settlement)."""
        self.in_flight = max(0, self.in_flight - count)
        if self._waiters:
            self._credit_returned.set()


async def yield_point() -> None:
    """
    Give subscribers a turn between two yields.

    The manager puts each raw event on every subscriber queue and immediately pulls the next one
    from the producer. Suspending here lets the subscribers' filters run, so a burst is consumed
    as it is produced instead of accumulating in the queues.
    """
    await asyncio.sleep(0)
