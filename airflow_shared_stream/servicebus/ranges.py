"""
Complete a run of consecutive Service Bus deliveries with one AMQP disposition.

``complete_message`` settles one message per disposition frame, and in azure-servicebus 7.15
each call costs the triggerer about as much CPU as receiving the message did: the retry
wrapper, the checks, a frame encoded in Python and an outcome waited for, on the core the
manager's own work shares (docs/benchmarks.rst, Service Bus).

AMQP 1.0 settles deliveries in ranges: a disposition names the first and the last delivery id,
and the peer applies it to every delivery in between (AMQP 1.0 section 2.7.6). Delivery ids are
numbered per session, across its links: a run here is ids that are all this receiver's messages
of the ACK batch, with none missing, so a range never names a delivery it was not given (a
management response or any other delivery in between breaks the run).

The SDK's own AMQP client (``_pyamqp``) accepts a ``(first, last)`` range in
``ReceiveClientAsync.settle_messages_async`` and waits for the outcome of every delivery of the
range when the receiver awaits outcomes (peek-lock, ``rcv-settle-mode second``). What it does
not do is keep its bookkeeping for a range: the receive link remembers the tag of every delivery
until that delivery is settled on the link (``_received_delivery_tags``), and a disposition
removes only the tag it is given. So the tags of the rest of the run are removed here, just
before the range goes out; without that the set would grow by one tag per completed message for
the life of the receiver.

That is the only private state this module changes; it reads a few private attributes of the
SDK's receiver and received messages (``_handler``, ``_delivery_id``, ``_delivery_tag``,
``_settled``, ``_lock_expired``). :func:`range_link` and :func:`message_supports_ranges` check
that they are there, and a receiver without them (another SDK version, the uamqp transport)
completes message by message as before. A message joins a run only if its tag is still held by
the receiver's *current* link: a re-opened link starts a new session and a new numbering, so a
message received before the SDK re-opened its link must not be settled by a range of the new
one; it is completed alone with ``complete_message``, as before.

A range never names a delivery it was not given to complete: a delivery still in flight
between two completed ones splits the run (:func:`split_runs`), whatever the broker does with
ranges.

Not verified against Azure Service Bus itself (no namespace here); verified against the test
server, whose AMQP engine (Qpid Proton) applies ranges as the specification says, and against
the same server told to apply a range to its first delivery only. A broker that does not apply
a range to every delivery in it leaves the rest without an outcome: the SDK would wait for them
for its whole operation timeout (60 s), longer than their locks, which are not renewed while they
are being settled. So the outcome of a range is awaited for a third of the shortest lock left in
it at most (:func:`outcome_timeout`), and a range not confirmed in that time raises
:class:`RangeUnconfirmed`: the producer completes its messages one by one, while their locks
still hold, and stops completing in ranges if any of them had not been completed (a broker that
ignores ranges costs speed, never a redelivery).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

T = TypeVar("T")

MIN_RUN = 2
"""Shortest run settled as a range; a lone message is completed with ``complete_message``."""

OUTCOME_SHARE_OF_LOCK = 1 / 3
"""Share of the shortest lock left in a range that its outcome is awaited for, at most: the rest
is left to complete the unconfirmed messages one by one before their locks run out."""

MIN_OUTCOME_TIMEOUT_SECONDS = 0.5
"""Shortest wait for a range's outcome (a lock with almost nothing left is lost anyway)."""


class RangeUnconfirmed(Exception):
    """The broker did not confirm the outcome of every delivery of a range in time."""


def outcome_timeout(lock_seconds_left: float | None, sdk_timeout: float | None) -> float | None:
    """How long to await a range's outcome: a share of the lock left, never past the SDK's timeout."""
    if lock_seconds_left is None:
        return sdk_timeout
    bound = max(MIN_OUTCOME_TIMEOUT_SECONDS, lock_seconds_left * OUTCOME_SHARE_OF_LOCK)
    return bound if sdk_timeout is None else min(sdk_timeout, bound)


@dataclass(frozen=True, slots=True)
class RangeLink:
    """The receive link of one receiver, as far as completing ranges on it needs."""

    handler: Any
    """The SDK's ``ReceiveClientAsync`` (``receiver._handler``): sends the disposition."""
    held_tags: set[bytes]
    """Tags of the deliveries received on this link and not settled on it yet."""
    check_lock_expiry: bool
    """Non-session receivers: the SDK refuses to settle a message whose lock ran out locally."""
    await_outcome: bool
    outcome_timeout: float | None

    def can_join(self, message: Any) -> bool:
        """Whether ``message`` may be settled by a range on this link (else: alone)."""
        return (
            isinstance(message._delivery_id, int)
            and message._delivery_tag in self.held_tags
            and not message._settled
            and not (self.check_lock_expiry and message._lock_expired)
        )

    async def complete(self, messages: Sequence[Any], *, lock_seconds_left: float | None = None) -> None:
        """
        Complete ``messages`` (consecutive delivery ids, see :func:`split_runs`) with one disposition.

        Raises what the SDK's client raises for a refused outcome of any delivery of the range
        (``MessageException``, for example ``com.microsoft:message-lock-lost``), and
        :class:`RangeUnconfirmed` when an outcome did not come within :func:`outcome_timeout` of
        ``lock_seconds_left`` (the shortest lock left in the range).
        """
        from azure.servicebus._pyamqp.error import MessageSettlementUnconfirmed

        first, last = messages[0], messages[-1]
        for message in messages[1:]:
            # The link keeps the tag of each delivery until it is settled there, and a
            # disposition removes only the tag it is given (see the module docstring).
            self.held_tags.discard(message._delivery_tag)
        try:
            await self.handler.settle_messages_async(
                (first._delivery_id, last._delivery_id),
                first._delivery_tag,
                "accepted",
                await_outcome=self.await_outcome,
                outcome_timeout=outcome_timeout(lock_seconds_left, self.outcome_timeout),
            )
        except MessageSettlementUnconfirmed as exc:
            raise RangeUnconfirmed(str(exc)) from exc
        for message in messages:
            message._settled = True  # as complete_message marks it


def range_link(receiver: Any) -> RangeLink | None:
    """
    The link of ``receiver`` if ranges can be completed on it now, else ``None``.

    ``None`` when the SDK lacks what a range needs (see the module docstring) or the receiver
    has no open link; its messages are then completed one by one.
    """
    handler = getattr(receiver, "_handler", None)
    link = getattr(handler, "_link", None)
    held_tags = getattr(link, "_received_delivery_tags", None)
    if not isinstance(held_tags, set) or not callable(getattr(handler, "settle_messages_async", None)):
        return None
    try:
        from azure.servicebus._pyamqp.error import MessageSettlementUnconfirmed  # noqa: F401
    except ImportError:
        return None
    config = getattr(receiver, "_config", None)
    return RangeLink(
        handler=handler,
        held_tags=held_tags,
        check_lock_expiry=not getattr(receiver, "_session", None),
        await_outcome=bool(getattr(receiver, "_await_settlement_outcome", True)),
        outcome_timeout=getattr(config, "timeout", None),
    )


def message_supports_ranges(message: Any) -> bool:
    """Whether a received message carries what :meth:`RangeLink.can_join` reads."""
    # ``_lock_expired`` is a property that raises on a session's message: look it up on the class.
    return hasattr(type(message), "_lock_expired") and all(
        hasattr(message, name) for name in ("_delivery_id", "_delivery_tag", "_settled")
    )


def split_runs(items: Sequence[T], delivery_id: Callable[[T], int]) -> tuple[list[list[T]], list[T]]:
    """
    Split ``items`` into runs of consecutive delivery ids (``MIN_RUN`` or more) and the rest.

    Each run is in delivery-id order. An id that appears twice (it cannot on one link) ends a
    run rather than joining it. Delivery ids are 32-bit serial numbers: a run does not cross the
    wrap from 2**32 - 1 to 0, it ends there.
    """
    runs: list[list[T]] = []
    rest: list[T] = []

    def close(run: list[T]) -> None:
        if len(run) >= MIN_RUN:
            runs.append(run)
        else:
            rest.extend(run)

    run: list[T] = []
    for item in sorted(items, key=delivery_id):
        if run and delivery_id(item) != delivery_id(run[-1]) + 1:
            close(run)
            run = []
        run.append(item)
    close(run)
    return runs, rest


def completion_runs(
    items: Sequence[T], message: Callable[[T], Any], receiver: Callable[[T], Any]
) -> tuple[list[tuple[RangeLink, list[T]]], list[T]]:
    """
    Split an ACK batch into runs completed with one disposition each, and the rest.

    A run is consecutive deliveries of one receiver's current link; what cannot join one (a lone
    message, one received on an earlier link, a locally expired lock, an SDK without what a
    range needs) is completed with ``complete_message``.
    """
    if len(items) < MIN_RUN or not message_supports_ranges(message(items[0])):
        return [], list(items)
    by_receiver: dict[int, list[T]] = {}
    for item in items:
        by_receiver.setdefault(id(receiver(item)), []).append(item)
    runs: list[tuple[RangeLink, list[T]]] = []
    alone: list[T] = []
    for group in by_receiver.values():
        link = range_link(receiver(group[0]))
        if link is None:
            alone.extend(group)
            continue
        joining: list[T] = []
        for item in group:
            (joining if link.can_join(message(item)) else alone).append(item)
        group_runs, rest = split_runs(joining, lambda i: message(i)._delivery_id)
        runs.extend((link, run) for run in group_runs)
        alone.extend(rest)
    return runs, alone
