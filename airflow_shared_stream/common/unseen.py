"""
Messages no watcher has seen: held by the stream, never given back to spend a delivery attempt.

Airflow's manager reports a message fanned out to nobody (every watcher gone from the fan-out, a
stuck one included: it stays subscribed while the manager leaves it out) with an all-zero
``AdvanceOutcome``. Given back to the broker, such a message comes straight back, reaches nobody
again, and each round spends one of the broker's delivery attempts (SQS ``maxReceiveCount``,
Service Bus ``MaxDeliveryCount``, a Pub/Sub dead-letter policy's ``max_delivery_attempts``):
within a minute the broker dead-letters messages that no watcher ever saw.

So the leased-queue template keeps them instead: their leases stay renewed, the stream offers
them to the watchers again (paced by the no-subscriber backoff) and receives nothing new while
it holds any. A message is held for at most ``hold_seconds`` from the first time it reached
nobody (:func:`hold_bound`: ``[shared_stream] unseen_hold_seconds``, else the triggerer's ack
timeout, capped where the broker bounds how long a lease can be renewed); past that it goes
back to the broker, with the broker's outcome that does not count as a delivery where it has
one (Service Bus: AMQP ``released``), and receiving resumes. An ordered lane is offered again,
or given back, whole and in its order.
This class is the bookkeeping; :mod:`.leased_queue` does the I/O.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Hashable, Iterable, Sequence
from typing import Generic, Protocol, TypeVar

from airflow_shared_stream.common.errors import SharedStreamConfigurationError
from airflow_shared_stream.common.flow_control import ack_timeout_seconds

log = logging.getLogger(__name__)

CONFIG_SECTION = "shared_stream"
CONFIG_KEY = "unseen_hold_seconds"


def configured_hold_seconds() -> float:
    """
    ``[shared_stream] unseen_hold_seconds``; unset, the triggerer's ``shared_stream_ack_timeout``
    (the setting Airflow's manager times events out by).
    """
    try:
        from airflow.configuration import conf

        raw = conf.get(CONFIG_SECTION, CONFIG_KEY, fallback="") or ""
    except Exception:  # pragma: no cover - configuration unreadable outside a deployment
        raw = ""
    if not raw.strip():
        return ack_timeout_seconds()
    try:
        seconds = float(raw)
    except ValueError:
        raise SharedStreamConfigurationError(
            f"[{CONFIG_SECTION}] {CONFIG_KEY} must be a number of seconds, got {raw!r}"
        ) from None
    # float() reads "nan": held for nan seconds, nothing would ever be given back.
    if math.isnan(seconds):
        raise SharedStreamConfigurationError(
            f"[{CONFIG_SECTION}] {CONFIG_KEY} must be a number of seconds, got {raw!r}"
        )
    # 0 would give a message back on the first no-subscriber round, where it comes straight back
    # and, on SQS and Pub/Sub, spends a delivery attempt each round: dead-lettered in seconds.
    if seconds <= 0:
        raise SharedStreamConfigurationError(
            f"[{CONFIG_SECTION}] {CONFIG_KEY} must be more than 0 seconds, got {raw!r}"
        )
    return seconds


def hold_bound(wanted: float, broker_limit: float | None, broker: str) -> float:
    """
    How long a stream holds a message nobody saw: ``wanted``, capped at what the broker lets a
    lease be renewed for (``broker_limit``; ``None``: no limit). Past the broker's limit the
    renewal would be refused and the message come back counted, so the cap is said once, loudly.
    """
    if broker_limit is None or wanted <= broker_limit:
        return wanted
    log.warning(
        "%s: [%s] %s is %.0fs, longer than the broker lets a message be held (%.0fs): holding "
        "messages no watcher has seen for %.0fs",
        broker,
        CONFIG_SECTION,
        CONFIG_KEY,
        wanted,
        broker_limit,
        broker_limit,
    )
    return max(0.0, broker_limit)


class _Leased(Protocol):
    @property
    def lease(self) -> Hashable: ...


D = TypeVar("D", bound=_Leased)


class UnseenMessages(Generic[D]):
    """
    The held messages no watcher has seen: waiting to be offered again, or on offer now.

    :param hold_seconds: longest a message is held from the first time it reached nobody.
    """

    def __init__(self, hold_seconds: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.hold_seconds = hold_seconds
        self._clock = clock
        self.waiting: list[D] = []
        """Held, in the order they came back, to be offered again."""
        self.offered: set[Hashable] = set()
        """Leases of held messages offered again whose advance has not come back yet."""
        self._since: dict[Hashable, float] = {}

    def __bool__(self) -> bool:
        """True while any message nobody has seen is held (waiting, or offered and not advanced)."""
        return bool(self.waiting or self.offered)

    def hold(self, deliveries: Sequence[D]) -> None:
        """Keep messages that reached nobody, to offer again; the bound starts at the first time."""
        now = self._clock()
        for delivery in deliveries:
            self.offered.discard(delivery.lease)
            self._since.setdefault(delivery.lease, now)
        self.waiting.extend(deliveries)

    def advanced(self, leases: Iterable[Hashable]) -> None:
        """These messages reached someone (or are settled): they are not held any more."""
        for lease in leases:
            self.offered.discard(lease)
            self._since.pop(lease, None)

    def take(
        self,
        ready: Callable[[D], bool] = lambda d: True,
        lane: Callable[[D], Hashable | None] = lambda d: None,
    ) -> tuple[list[D], list[D]]:
        """
        What is waiting and ``ready``, split into ``(offer_again, give_back)``; both leave the
        waiting list (what is not ready stays).

        ``give_back``: held ``hold_seconds`` or longer, forgotten here, and with them every other
        message of their ``lane`` (an ordered lane goes back whole, to keep its order).
        ``offer_again``: on offer until :meth:`hold` (nobody again) or :meth:`advanced`.
        """
        now = self._clock()
        taken = [d for d in self.waiting if ready(d)]
        self.waiting = [d for d in self.waiting if not ready(d)]
        expired = {id(d) for d in taken if now - self._since.get(d.lease, now) >= self.hold_seconds}
        lanes = {lane(d) for d in taken if id(d) in expired} - {None}
        offer: list[D] = []
        give_back: list[D] = []
        for delivery in taken:
            if id(delivery) in expired or (lanes and lane(delivery) in lanes):
                give_back.append(delivery)
            else:
                offer.append(delivery)
        self.advanced(d.lease for d in give_back)
        self.offered.update(d.lease for d in offer)
        return offer, give_back

    def forget(self, leases: Iterable[Hashable]) -> None:
        """Drop messages whose lease is gone (the broker refused a renewal)."""
        gone = set(leases)
        self.waiting = [d for d in self.waiting if d.lease not in gone]
        self.advanced(gone)
