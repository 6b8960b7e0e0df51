"""
When to renew Service Bus locks: from what the broker says each lock is, not from an argument.

Every peek-lock delivery carries its lock's expiry (``locked_until_utc``), a session receiver its
session's, and every renewal answers with the new expiry. The entity's lock duration itself is
only readable through the management API (it needs the *Manage* right), and a lock length given
as a trigger argument was wrong whenever the entity said otherwise: locks ran out between
renewals, and every message came back while its events were still being persisted.
"""

from __future__ import annotations

import datetime
from collections.abc import Iterable
from typing import Any

from airflow_shared_stream.common.leases import LeaseKeeper

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
    keeper renews every third of it. The shortest (a message that waited in a prefetch buffer, a
    renewal that came late) is renewed within a third of what it has left.
    """
    left = [seconds for seconds in seconds_left if seconds is not None]
    if not left or keeper is None:
        return
    keeper.renew_every = max(MIN_RENEW_INTERVAL_SECONDS, max(left) / 3)
    keeper.renew_within(min(keeper.renew_every, min(left) / 3))
