"""
The sessions of a session-enabled Service Bus entity: each an ordered lane with its own receiver.

The producer holds up to ``max_concurrent_sessions`` session receivers, accepting the next
available session whenever it has room; a session whose receiver stays empty is released for
other consumers.

Two things keep a session's order through a redelivery. Session receivers prefetch: without
prefetch the SDK gives back ("releases") a message that arrives while no receive call waits,
and the service sends an abandoned session message straight back, so a redelivered message
could be released while the one after it was handed out. And an abandon gives the session up:
the service puts an abandoned message back at the head of its session, but what the receiver
already holds (prefetched, or received and not yet handed out) is ahead of it on the link.
Closing the receiver releases all of that; the session is then taken again from its head.

Prefetch has a price: a session receiver holds messages nobody has been handed yet, and when the
session lock runs out the service counts a delivery of every message locked on the link. So the
lock of every session the stream holds is kept (:meth:`SessionReceivers.keep_locks`), whether or
not a message of it is in flight: a session behind a full credit window keeps its prefetched
messages uncounted. Giving a session up (closing its receiver) returns what it holds with its
delivery count unchanged: that is how messages of a session are given back unseen.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from airflow_shared_stream.common.leased_queue import Delivery
from airflow_shared_stream.servicebus.errors import is_lock_lost, is_timeout
from airflow_shared_stream.servicebus.locks import (
    ASSUMED_LOCK_SECONDS,
    MIN_RENEW_INTERVAL_SECONDS,
    seconds_until,
)
from airflow_shared_stream.servicebus.parts import StreamOwner

log = logging.getLogger(__name__)

SESSION_ACCEPT_RETRY_SECONDS = 2.0
"""While sessions are held, how long after finding no free session the producer asks again."""

IDLE_RECEIVES_BEFORE_RELEASE = 3
"""Empty receives in a row after which a session with nothing in flight is released."""


@dataclass(eq=False)
class SessionReceiver:
    """One accepted session: its receiver and when it last gave us something."""

    receiver: Any
    session_id: str
    idle_receives: int = 0
    in_flight: set[str] = field(default_factory=set)
    restarting: bool = False
    """A message of it was abandoned: given up at the next receive, taken again from its head."""
    closed: bool = False
    """Its receiver is closed: the service has its session lock and every message it held back."""
    renew_at: float = 0.0
    """Loop time by which its session lock is renewed next (:meth:`SessionReceivers.keep_locks`)."""
    abandoning: int = 0
    """Abandons of its messages under way: the service may send an abandoned one straight back."""
    abandons_done: asyncio.Event = field(default_factory=asyncio.Event)

    def lock_left(self) -> float:
        """Seconds its session lock has left (at least the shortest renewal interval)."""
        left = seconds_until(getattr(self.receiver.session, "locked_until_utc", None))
        return max(MIN_RENEW_INTERVAL_SECONDS, ASSUMED_LOCK_SECONDS if left is None else left)

    def lock_renewed(self) -> None:
        """Its session lock was just taken or renewed: renew it again within a third of what it has left."""
        left = seconds_until(getattr(self.receiver.session, "locked_until_utc", None))
        interval = MIN_RENEW_INTERVAL_SECONDS if left is None else max(MIN_RENEW_INTERVAL_SECONDS, left / 3)
        self.renew_at = asyncio.get_running_loop().time() + interval


class SessionReceivers:
    """
    The sessions one stream holds: accepted, received from in turn, and given up.

    :param open_receiver: builds a (not yet opened) session receiver from the SDK's keyword
        arguments.
    :param owner: the stream, told of a session whose lock was lost while receiving (it is
        released), and explaining the SDK's errors.
    :param management_of: the lock every ``$management`` request on a receiver takes (the SDK
        fails requests that race on one receiver).
    """

    def __init__(
        self,
        *,
        entity_path: str,
        max_sessions: int,
        max_wait_time: float,
        prefetch: int,
        open_receiver: Callable[..., Any],
        owner: StreamOwner,
        management_of: Callable[[Any], asyncio.Lock],
    ) -> None:
        self._entity_path = entity_path
        self._max_sessions = max_sessions
        self._max_wait_time = max_wait_time
        self._prefetch = prefetch
        self._open_receiver = open_receiver
        self._owner = owner
        self._management_of = management_of
        self.held: list[SessionReceiver] = []
        self._next_accept = 0.0
        self._keeper: asyncio.Task[None] | None = None
        self._turn = 0
        """Receives so far: where in :attr:`held` the next one starts."""

    def ids(self) -> list[str]:
        """The sessions held, in receive order."""
        return [str(session.session_id) for session in self.held]

    async def receive(
        self, max_messages: int, deliver: Callable[[Any, SessionReceiver], Delivery[Any]]
    ) -> list[Delivery[Any]]:
        """One receive from each held session (sharing ``max_messages``); ``deliver`` wraps each message."""
        for session in [s for s in self.held if s.restarting]:
            await self.release(session)
        await self._accept()
        if not self.held:
            return []
        deliveries: list[Delivery[Any]] = []
        per_session = max(1, max_messages // len(self.held))
        # Each receive starts at the next session: with fewer free credits than sessions, a
        # session that always has messages would otherwise take them all, and the sessions
        # after it would wait (their messages prefetched, locked to this stream) until it empties.
        start = self._turn % len(self.held)
        self._turn += 1
        for session in self.held[start:] + self.held[:start]:
            want = min(per_session, max_messages - len(deliveries))
            if want <= 0:
                break
            try:
                messages = await session.receiver.receive_messages(
                    max_message_count=want, max_wait_time=min(1.0, self._max_wait_time)
                )
            except Exception as exc:
                if is_lock_lost(exc):
                    self._owner.lock_lost(f"session {session.session_id!r}", exc)
                    await self.release(session)
                    continue
                if is_timeout(exc):
                    # The SDK re-attached a dropped session link and found no session: drop it.
                    log.debug("Session receiver of %s found no session; releasing it", self._entity_path)
                    await self.release(session)
                    continue
                raise self._owner.explain("receive from", exc) from None
            while session.abandoning:
                # What it brought may be a message being abandoned, sent straight back before
                # the session is marked ``restarting``: wait for the abandons, then give it up.
                session.abandons_done.clear()
                await session.abandons_done.wait()
            if session.restarting:
                # A message of it was abandoned while this receive waited: what it brought is
                # later in the session, and closing the receiver gives it back.
                await self.release(session)
                continue
            session.idle_receives = 0 if messages else session.idle_receives + 1
            for message in messages:
                delivery = deliver(message, session)
                session.in_flight.add(str(delivery.lease))
                deliveries.append(delivery)
            if session.idle_receives >= IDLE_RECEIVES_BEFORE_RELEASE and not session.in_flight:
                await self.release(session)
        return deliveries

    async def _accept(self) -> None:
        """
        Accept the next available sessions while there is room (a short wait each).

        A wait that found no free session is not repeated for ``SESSION_ACCEPT_RETRY_SECONDS``
        while sessions are held: each wait costs a receive cycle up to a second, and the sessions
        already held must be read (and settled) well within their lock duration.
        """
        from azure.servicebus import NEXT_AVAILABLE_SESSION

        loop = asyncio.get_running_loop()
        if self.held and loop.time() < self._next_accept:
            return
        while len(self.held) < self._max_sessions:
            receiver = self._open_receiver(
                session_id=NEXT_AVAILABLE_SESSION, max_wait_time=1, prefetch_count=self._prefetch
            )
            try:
                await receiver.__aenter__()
            except Exception as exc:
                await close_quietly(receiver)
                if not is_timeout(exc):
                    raise self._owner.explain("accept a session of", exc) from None
                session_id = None
            else:
                session_id = receiver.session.session_id
            if not isinstance(session_id, str):
                # No session was free. Service Bus answers the attach and then refuses it
                # (com.microsoft:timeout); the SDK can return such a receiver as if it held a
                # session, its id still the NEXT_AVAILABLE filter. It holds nothing: drop it.
                await close_quietly(receiver)
                self._next_accept = loop.time() + SESSION_ACCEPT_RETRY_SECONDS
                if not self.held:
                    await asyncio.sleep(min(1.0, self._max_wait_time))
                return
            session = SessionReceiver(receiver, session_id)
            session.lock_renewed()
            self.held.append(session)
            self._start_keeping_locks()
            log.debug("Accepted session %r of %s", session_id, self._entity_path)

    # -- session locks ----------------------------------------------------------------------------

    def _start_keeping_locks(self) -> None:
        if self._keeper is None or self._keeper.done():
            self._keeper = asyncio.create_task(
                self.keep_locks(), name="shared-stream-session-locks[servicebus]"
            )

    async def keep_locks(self) -> None:
        """
        Renew the lock of every held session within a third of what it has left, for as long as
        it is held: the background task of the stream's sessions.

        The lease keeper renews a session's lock through its messages in flight; a session with
        none (all settled, the rest prefetched, the credit window full) is renewed here, or its
        lock runs out and the service counts a delivery of every message its receiver holds.

        Each session is renewed on its own, and each renewal is bounded by what its lock has
        left: every session receiver has a connection of its own, and a renewal hung on one (a
        stalled connection, a slow answer) must not hold back the others' until their locks lapse.
        """
        loop = asyncio.get_running_loop()
        renewing: dict[SessionReceiver, asyncio.Task[None]] = {}
        try:
            while True:
                now = loop.time()
                for session, task in list(renewing.items()):
                    if task.done():
                        del renewing[session]
                for session in self.held:
                    if session.renew_at <= now and session not in renewing:
                        renewing[session] = asyncio.create_task(
                            self._renew(session, within=session.lock_left()),
                            name=f"shared-stream-session-lock[{session.session_id}]",
                        )
                waiting = [s.renew_at for s in self.held if s not in renewing]
                wake = min(waiting, default=now + MIN_RENEW_INTERVAL_SECONDS)
                await asyncio.sleep(min(MIN_RENEW_INTERVAL_SECONDS, max(0.0, wake - loop.time())))
        finally:
            for task in renewing.values():
                task.cancel()
            await asyncio.gather(*renewing.values(), return_exceptions=True)

    async def _renew(self, session: SessionReceiver, *, within: float | None) -> None:
        """Renew a session's lock, giving up after ``within`` seconds (past them it is lost anyway)."""
        try:
            async with self._management_of(session.receiver):
                if session.closed:
                    return
                await session.receiver.session.renew_lock(timeout=within)
                session.lock_renewed()
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            if session.closed:
                return  # given up meanwhile: nothing left to renew
            if is_lock_lost(exc):
                self._owner.lock_lost(f"session lock of {session.session_id!r}", exc)
                await self.release(session)
                return
            # Retried on the next pass, well within the lock (a third of it is used up per pass).
            session.renew_at = asyncio.get_running_loop().time() + MIN_RENEW_INTERVAL_SECONDS
            log.warning(
                "Renewing the lock of session %r of %s failed (%s); retrying",
                session.session_id,
                self._entity_path,
                type(exc).__name__,
            )

    async def release(self, session: SessionReceiver) -> None:
        """Give a session up: closing its receiver gives back its lock and all it held."""
        if session in self.held:
            self.held.remove(session)
        session.closed = True
        await close_quietly(session.receiver)

    def forget(self, lease: str) -> None:
        """A message was settled: no session has it in flight any more."""
        for session in self.held:
            session.in_flight.discard(lease)

    async def close(self) -> None:
        keeper, self._keeper = self._keeper, None
        if keeper is not None:
            keeper.cancel()
            await asyncio.gather(keeper, return_exceptions=True)
        for session in self.held:
            session.closed = True
            await close_quietly(session.receiver)
        self.held.clear()


def session_closed(delivery: Delivery[Any]) -> bool:
    """
    A session message whose receiver is closed (given up, or its session lock lost, while the
    message was held unseen): the service has it back, and the session, taken again, brings it
    again. Offered from the closed receiver too, it would reach the watchers twice.
    """
    session = delivery.handle.session
    return session is not None and session.closed


async def close_quietly(closable: Any) -> None:
    """Close an SDK receiver or client, best effort: a lock left behind runs out on the broker."""
    try:
        await closable.close()
    except Exception as exc:
        log.debug("Closing %s failed: %s", type(closable).__name__, type(exc).__name__)


@dataclass(slots=True)
class ReceivedMessage:
    """A received message, the receiver that must settle it, and its session (if any)."""

    message: Any
    receiver: Any
    session: SessionReceiver | None = None


def first_of_each_session(deliveries: Iterable[Delivery[Any]]) -> dict[SessionReceiver, Delivery[Any]]:
    """
    The message of each session a redelivery abandons: its first, by sequence number.

    The later ones (held back behind it, nobody saw them) come back, uncounted, when the session's
    receiver is closed; a session already being given up abandons none (that would count one).
    """
    heads: dict[SessionReceiver, Delivery[Any]] = {}
    for delivery in deliveries:
        session = delivery.handle.session
        if session is not None and not session.restarting:
            heads[session] = min(heads.get(session, delivery), delivery, key=_sequence_number)
    return heads


def _sequence_number(delivery: Delivery[Any]) -> int:
    return int(delivery.handle.message.sequence_number)
