"""
Renewing Service Bus locks, on a schedule read from the broker rather than from an argument.

Every peek-lock delivery carries its lock's expiry (``locked_until_utc``), a session receiver its
session's, and every renewal answers with the new expiry. The entity's lock duration itself is
only readable through the management API (it needs the *Manage* right), and a lock length given
as a trigger argument was wrong whenever the entity said otherwise: locks ran out between
renewals, and every message came back while its events were still being persisted.

A lock that is lost anyway (the renewal came too late, the link dropped) is not an error of the
stream: Service Bus redelivers the message.
"""

from __future__ import annotations

import asyncio
import datetime
import logging
import weakref
from collections.abc import Iterable, Sequence
from typing import Any

from airflow_shared_stream.common.leased_queue import Delivery
from airflow_shared_stream.common.leases import LeaseKeeper, renew_interval
from airflow_shared_stream.servicebus.errors import is_lock_lost
from airflow_shared_stream.servicebus.parts import StreamOwner

log = logging.getLogger(__name__)

ASSUMED_LOCK_SECONDS = 60.0
"""Service Bus's default lock duration: the renewal period until a delivery says how long its lock is."""

MIN_RENEW_INTERVAL_SECONDS = 1.0
"""Shortest time between renewal passes, whatever a lock's expiry says (a clock running ahead of
the service's makes every lock look shorter; Service Bus's shortest lock is 5 s)."""


def seconds_until(when: datetime.datetime | None) -> float | None:
    """Seconds from now until ``when`` (a UTC time the service gave), on this machine's clock."""
    if when is None:
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=datetime.timezone.utc)
    return (when - datetime.datetime.now(datetime.timezone.utc)).total_seconds()


def lock_left(message: Any, session: Any | None) -> float | None:
    """
    Seconds the lock of a received message has left: its own, or on a session (the SDK's
    ``ServiceBusSession`` of its receiver), the session's.

    Compared with this machine's clock, as the SDK compares them when it refuses to settle a
    message whose lock it thinks ran out.
    """
    if session is not None:
        return seconds_until(getattr(session, "locked_until_utc", None))
    return seconds_until(message.locked_until_utc)


def renew_in_time(keeper: LeaseKeeper[Any] | None, seconds_left: Iterable[float | None]) -> None:
    """
    Plan the keeper's renewals for locks whose expiry was just read (received, or renewed).

    The longest of them is a lock just taken or renewed: the entity's lock duration, and the
    keeper renews at :func:`~airflow_shared_stream.common.leases.renew_interval` of it (a third,
    or sooner to leave headroom for a stalled loop). The shortest (a message that waited in a
    prefetch buffer, a renewal that came late) is renewed within that share of what it has left.
    """
    left = [seconds for seconds in seconds_left if seconds is not None]
    if not left or keeper is None:
        return
    keeper.renew_every = max(MIN_RENEW_INTERVAL_SECONDS, renew_interval(max(left)))
    keeper.renew_within(min(keeper.renew_every, renew_interval(min(left))))


def delivery_lock_left(delivery: Delivery[Any]) -> float | None:
    """Seconds the lock of a delivery's message has left (:func:`lock_left`)."""
    received = delivery.handle
    session = received.receiver.session if received.session is not None else None
    return lock_left(received.message, session)


class LockRenewer:
    """
    Renews the locks of held messages: one ``renew-lock`` request per receiver for all its messages.

    The ``$management`` ``com.microsoft:renew-lock`` operation takes a list of lock tokens; the
    SDK's public ``renew_message_lock`` sends one token per request, and each request behind a
    pending receive waits for the receiver's socket timeout. Requests on one receiver go one
    after another, never together: the SDK fails management requests that race on one receiver
    ("Management Operation error occurred", then the handler shuts down). Receivers (each
    session has its own, on a connection of its own) are renewed together. A session's messages
    are renewed by renewing the session's lock, once per round (a held session with no message in
    flight is renewed by :meth:`.SessionReceivers.keep_locks`).

    :param owner: the stream, told of each lock found lost (the lease keeper the lost
        deliveries are returned to counts them).
    """

    def __init__(
        self,
        *,
        sessions: bool,
        owner: StreamOwner,
    ) -> None:
        self._sessions = sessions
        self._owner = owner
        self._management: weakref.WeakKeyDictionary[Any, asyncio.Lock] = weakref.WeakKeyDictionary()

    def management_of(self, receiver: Any) -> asyncio.Lock:
        """The lock every ``$management`` request of the stream on ``receiver`` takes, one at a time."""
        lock = self._management.get(receiver)
        if lock is None:
            lock = self._management[receiver] = asyncio.Lock()
        return lock

    async def renew(
        self, deliveries: Sequence[Delivery[Any]], keeper: LeaseKeeper[Any] | None
    ) -> list[Delivery[Any]]:
        """Renew the locks of ``deliveries`` and plan ``keeper``'s next pass; return the lost ones."""
        by_receiver: dict[int, list[Delivery[Any]]] = {}
        for delivery in deliveries:
            by_receiver.setdefault(id(delivery.handle.receiver), []).append(delivery)
        lost: list[Delivery[Any]] = []
        results = await asyncio.gather(
            *(self._renew_receiver(group, keeper) for group in by_receiver.values()), return_exceptions=True
        )
        for result in results:
            if isinstance(result, BaseException):
                raise result
            lost.extend(result)
        return lost

    async def _renew_receiver(
        self, group: Sequence[Delivery[Any]], keeper: LeaseKeeper[Any] | None
    ) -> list[Delivery[Any]]:
        async with self.management_of(group[0].handle.receiver):
            return await self._renew_receiver_locked(group, keeper)

    async def _renew_receiver_locked(
        self, group: Sequence[Delivery[Any]], keeper: LeaseKeeper[Any] | None
    ) -> list[Delivery[Any]]:
        receiver = group[0].handle.receiver
        session = group[0].handle.session
        if session is not None and session.closed:
            return []  # given up: the service has them back, nothing to renew
        if not self._sessions:
            if await self._renew_together(receiver, group, keeper):
                return []
            return await self._renew_one_by_one(group, keeper)
        try:
            renew_in_time(keeper, [seconds_until(await receiver.session.renew_lock())])
            if session is not None:
                session.lock_renewed()  # the sessions' own lock keeper need not renew it now
        except Exception as exc:
            if not is_lock_lost(exc):
                raise self._owner.explain("renew a lock on", exc) from None
            self._owner.lock_lost(
                f"session lock renewal of {self._owner.label(group[0])}", exc, counted_elsewhere=True
            )
            return list(group)
        return []

    async def _renew_together(
        self, receiver: Any, group: Sequence[Delivery[Any]], keeper: LeaseKeeper[Any] | None
    ) -> bool:
        """
        Renew every lock of ``group`` in one request; ``False`` if it must be done one by one.

        Uses the SDK's ``_renew_locks`` (the request ``renew_message_lock`` sends, with all the
        tokens) and records each new expiry on its message as ``renew_message_lock`` does: the
        SDK refuses to settle a message whose recorded lock has run out. Falls back (``False``)
        when the SDK lacks it, or when a lock in the request is lost: the service then renews
        none of them, and renewing one by one tells which one is gone.
        """
        renew_locks = getattr(receiver, "_renew_locks", None)
        if renew_locks is None or len(group) == 1:
            return False
        try:
            from azure.servicebus._common.constants import MGMT_RESPONSE_MESSAGE_EXPIRATION
            from azure.servicebus._common.utils import utc_from_timestamp
        except ImportError:
            return False
        try:
            answer = await renew_locks(*(d.handle.message.lock_token for d in group))
        except Exception as exc:
            if is_lock_lost(exc):
                log.debug("A lock of %d renewed together was lost; renewing one by one", len(group))
                return False
            raise self._owner.explain("renew the locks on", exc) from None
        expirations = list(answer.get(MGMT_RESPONSE_MESSAGE_EXPIRATION) or ())
        if len(expirations) != len(group):
            return False
        for delivery, expiry_ms in zip(group, expirations, strict=True):
            delivery.handle.message._expiry = utc_from_timestamp(expiry_ms / 1000.0)
        renew_in_time(keeper, (delivery_lock_left(d) for d in group))
        return True

    async def _renew_one_by_one(
        self, group: Sequence[Delivery[Any]], keeper: LeaseKeeper[Any] | None
    ) -> list[Delivery[Any]]:
        lost: list[Delivery[Any]] = []
        for delivery in group:
            received = delivery.handle
            try:
                expiry = await received.receiver.renew_message_lock(received.message)
                renew_in_time(keeper, [seconds_until(expiry)])
            except Exception as exc:
                if is_lock_lost(exc):
                    self._owner.lock_lost(
                        f"lock renewal of {self._owner.label(delivery)}", exc, counted_elsewhere=True
                    )
                    lost.append(delivery)
                    continue
                raise self._owner.explain("renew a lock on", exc) from None
        return lost
