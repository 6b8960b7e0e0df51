"""
The Service Bus half of a shared stream: one peek-lock receiver per entity, on the leased-queue template.

===========  ===============================================================================
ACK          one disposition ``accepted`` per run of consecutive deliveries
             (:mod:`.ranges`), ``complete_message`` for a message that is not in such a run
REDELIVER    ``abandon_message``: available again at once, its delivery count + 1
             (a message no watcher has seen, given back: AMQP ``released``, count unchanged)
DEAD-LETTER  ``dead_letter_message`` with ``reason`` (``rejected`` or ``unprocessable``) and an
             ``error_description`` naming the watcher whose ``reject`` refused it, or the cause
===========  ===============================================================================

Every settlement goes through the receiver that received the message (a peek-lock token is only
valid there). The SDK's settlement calls settle one message each, and the SDK (7.15) waits for each
outcome (``rcv-settle-mode second``). What a settlement costs is set by one lock in the SDK's
transport: reading a frame and writing one take the same socket lock, and a read holds it for
up to the receiver's socket timeout (0.2 s by default) when nothing arrives. A receive pending on
an idle link reads in such rounds, so each settlement waits for one to end before its frame can
even be written: 0.2 s each, one after another, measured against the test server. Outcome
waiters, too, read one frame per turn and then sit the timeout out once the outcomes have been
read by someone else: 100 completes awaited together took 0.21 s, 200 awaited five at a time
12.9 s. So:

* the receivers use a socket timeout of ``RECEIVER_SOCKET_TIMEOUT_SECONDS`` (20 ms), which
  bounds every such wait;
* the settlements of a batch are sent together and their outcomes awaited together (at most
  ``settle_batch_limit``), which pays the wait once per batch rather than once per message;
* unordered ACKs are coalesced across advances by the template's ACK batcher, as on SQS and
  Pub/Sub, and sent in the background, one batch at a time (``ACK_SENDS_IN_FLIGHT``), so the
  advance returns and the next receive overlaps it.

Outcomes are still awaited: a complete the service refused (the lock was lost) is counted and
logged, not assumed.

While a message waits for its trigger events to be persisted, its lock is renewed by the
template's lease keeper, for at most the triggerer's ack timeout, on a schedule read from the
broker: every delivery says until when its lock holds (``locked_until_utc``; on a session, the
session's lock), and so does every renewal. The keeper renews every third of the longest lock it
was told of (a lock just taken: the entity's lock duration), and brings its next pass forward for
a lock that has less left. The entity's lock duration is not read through the management API
(it needs the *Manage* right), and a lock length given as an argument was wrong whenever the
entity said otherwise. A lock that is lost anyway (the renewal came too late, the link dropped) is
not an error of the stream: Service Bus redelivers the message, so the settlement is logged and
counted (``lease_losses``) and the stream goes on.

Sessions: on a session-enabled entity (``session_enabled=True``) the producer holds up to
``max_concurrent_sessions`` session receivers, accepting the next available session whenever it
has room; each session is an ordered lane (an abandoned message holds back the later ones of its
session), and a session whose receiver stays empty is released for other consumers. Without
sessions there is no order to keep: the messages of one receive call share an advance lane.

Two things keep a session's order through a redelivery. Session receivers prefetch: without
prefetch the SDK gives back ("releases") a message that arrives while no receive call waits,
and the service sends an abandoned session message straight back, so a redelivered message
could be released while the one after it was handed out (CI saw a session come back as 2, 1).
And an abandon gives the session up: the service puts an abandoned message back at the head
of its session, but what the receiver already holds (prefetched, or received and not yet
handed out) is ahead of it on the link. Closing the receiver releases all of that; the session
is then taken again from its head.
"""

from __future__ import annotations

import asyncio
import base64
import datetime
import logging
import re
import uuid
import weakref
from collections.abc import Awaitable, Collection, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from airflow_shared_stream.common import metrics as m
from airflow_shared_stream.common.errors import SecretScrubber, require_sdk
from airflow_shared_stream.common.leased_queue import DeadLetter, Delivery, LeasedQueueProducer
from airflow_shared_stream.common.matching import body_size, build_message
from airflow_shared_stream.common.trigger import DEFAULT_MAX_PAYLOAD_BYTES
from airflow_shared_stream.servicebus.errors import (
    ServiceBusAccessError,
    ServiceBusConfigurationError,
    ServiceBusEndpointError,
    ServiceBusEntityNotFoundError,
    ServiceBusSharedStreamError,
)
from airflow_shared_stream.servicebus.hook import ServiceBusClientConfig, ServiceBusSharedStreamHook
from airflow_shared_stream.servicebus.locks import (
    ASSUMED_LOCK_SECONDS,
    lock_left,
    renew_in_time,
    seconds_until,
)
from airflow_shared_stream.servicebus.ranges import (
    MIN_RUN,
    RangeLink,
    RangeUnconfirmed,
    message_supports_ranges,
    range_link,
    split_runs,
)

require_sdk("azure.servicebus", "servicebus")

log = logging.getLogger(__name__)

UNAUTHORIZED_STATUS = re.compile(r"(?<![\d.:])401(?!\d)")
"""A 401 status in an SDK error's text: the number alone, not digits of a port or an address
(a refused connection to 127.0.0.1:54011 read as a refused credential)."""

SETTLE_BATCH_LIMIT = 100
"""Most messages per ACK, abandon, dead-letter or lock-renewal batch (the ACK batcher's batch)."""

RECEIVER_SOCKET_TIMEOUT_SECONDS = 0.02
"""Socket timeout of the receivers (the SDK's ``socket_timeout``; its default is 0.2 s).

The SDK reads in rounds of this length while a receive waits on an idle link, holding the socket
lock that every settlement and management request needs to write its frame (see the module
docstring): it is the longest a settlement waits behind a pending receive. Measured on the
benchmark (bench/watchers.py, test server on loopback), 1 / 10 watchers: 0.2 s gave 880 / 620
messages/s, 0.05 s 1,200 / 1,320, 0.02 s 1,880 / 1,310, 0.01 s 1,110 / 840, 0.005 s 160 /
1,350 (shorter rounds cut frames being read in half more often; the SDK keeps the partial frame
and resumes, so a short timeout costs CPU, never data). An idle stream pays one wake-up per
round, 50 a second."""

ACK_SENDS_IN_FLIGHT = 1
"""ACK batches sent in the background at once on a stream: one.

Still in the background (the advance returns and the next receive goes out meanwhile), but a
second batch of outcome waiters on the same connection reads the first one's outcomes and waits
the socket timeout out more often: bench/watchers.py at 10 watchers gave 1,640-2,320 messages/s
with 1 (five runs), 1,380-1,590 with 2 (five runs), 1,320 with 4."""

DEAD_LETTER_DESCRIPTION_LIMIT = 4096
"""Service Bus limits a dead-letter description; longer ones are cut (with an ellipsis)."""

SESSION_ACCEPT_RETRY_SECONDS = 2.0
"""While sessions are held, how long after finding no free session the producer asks again."""

SDK_LOGGERS = ("azure.servicebus", "azure.core", "azure.identity")
"""Loggers the secret scrubber is attached to: the SDK logs connection details itself."""

_live_streams: dict[tuple[str, str], str] = {}
"""(namespace, entity) -> connection id of the producer reading it in this triggerer process."""


@dataclass(frozen=True)
class Entity:
    """A receivable Service Bus entity: a queue, or a topic's subscription."""

    queue_name: str | None = None
    topic_name: str | None = None
    subscription_name: str | None = None

    @classmethod
    def of(cls, queue_name: str | None, topic_name: str | None, subscription_name: str | None) -> Entity:
        """Validate "exactly one queue, or a topic with a subscription"; raise naming what is wrong."""
        for name, value in (
            ("queue_name", queue_name),
            ("topic_name", topic_name),
            ("subscription_name", subscription_name),
        ):
            if value is not None and (not isinstance(value, str) or not value.strip()):
                raise ServiceBusConfigurationError(f"{name} must be a non-empty string, got {value!r}")
            if value is not None and ("/" in value.strip("/") or "$" in value):
                raise ServiceBusConfigurationError(
                    f"{name} must be an entity name, not a path: {value!r} (dead-letter sub-queues are "
                    "not streams of their own)"
                )
        if queue_name is not None:
            if topic_name is not None or subscription_name is not None:
                raise ServiceBusConfigurationError(
                    "give either queue_name, or topic_name with subscription_name, not both"
                )
            return cls(queue_name=queue_name.strip("/"))
        if topic_name is None or subscription_name is None:
            raise ServiceBusConfigurationError(
                "a Service Bus stream reads a queue (queue_name=...) or a topic subscription "
                "(topic_name=... and subscription_name=...): "
                + ("subscription_name is missing" if topic_name else "no entity was given")
            )
        return cls(topic_name=topic_name.strip("/"), subscription_name=subscription_name.strip("/"))

    @property
    def path(self) -> str:
        """The entity path as the service names it (``queue`` or ``topic/Subscriptions/sub``)."""
        if self.queue_name is not None:
            return self.queue_name
        return f"{self.topic_name}/Subscriptions/{self.subscription_name}"

    @property
    def identity(self) -> str:
        """Entity names are case-insensitive on Service Bus: the normalised path."""
        return self.path.lower()


@dataclass(eq=False)
class _SessionReceiver:
    """One accepted session: its receiver and when it last gave us something."""

    receiver: Any
    session_id: str
    idle_receives: int = 0
    in_flight: set[str] = field(default_factory=set)
    restarting: bool = False
    """A message of it was abandoned: given up at the next receive, taken again from its head."""
    closed: bool = False
    """Its receiver is closed: the service has its session lock and every message it held back."""


def _jsonable(value: Any) -> Any:
    """An SDK property value as JSON: bytes as UTF-8 text (else base64), times as ISO 8601."""
    if isinstance(value, bytes | bytearray | memoryview):
        raw = bytes(value)
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            return base64.b64encode(raw).decode("ascii")
    if isinstance(value, datetime.datetime):
        return value.isoformat()
    if isinstance(value, uuid.UUID):
        return str(value)
    if isinstance(value, dict):
        return {str(_jsonable(k)): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    return value


def message_body(message: Any) -> bytes | str | None:
    """The body as bytes (data sections joined) or, for an AMQP value body, its JSON text."""
    from azure.servicebus.amqp import AmqpMessageBodyType

    raw = message.raw_amqp_message
    if raw.body_type == AmqpMessageBodyType.DATA:
        return b"".join(bytes(section) for section in raw.body)
    value = raw.body
    if value is None or isinstance(value, bytes | str):
        return value
    import json

    return json.dumps(_jsonable(value if raw.body_type == AmqpMessageBodyType.VALUE else list(value)))


def envelope_metadata(message: Any, entity: Entity, namespace: str) -> dict[str, Any]:
    """The broker half of the envelope every watcher matches on (JSON-able, secret-free)."""
    return {
        "message_id": _jsonable(message.message_id),
        "sequence_number": message.sequence_number,
        "enqueued_time": _jsonable(message.enqueued_time_utc),
        "delivery_count": message.delivery_count,
        "application_properties": _jsonable(dict(message.application_properties or {})),
        "content_type": _jsonable(message.content_type),
        "correlation_id": _jsonable(message.correlation_id),
        "subject": _jsonable(message.subject),
        "session_id": _jsonable(message.session_id),
        "entity": entity.path,
        "namespace": namespace,
    }


class ServiceBusSharedStreamProducer(LeasedQueueProducer[Any]):
    """
    Receive from one queue or subscription for every watcher that shares it; settle per the table.

    Built by :meth:`ServiceBusSharedStreamTrigger.create_shared_stream_producer` from the first
    watcher's arguments; connects only in :meth:`open_stream`. The handle of each delivery is
    the SDK's ``ServiceBusReceivedMessage``, settled with the receiver that received it.
    """

    broker = "servicebus"
    settle_batch_limit = SETTLE_BATCH_LIMIT
    dead_letter_batch_limit = SETTLE_BATCH_LIMIT
    ack_sends_in_flight = ACK_SENDS_IN_FLIGHT
    renewals_in_flight = 1  # the SDK fails management requests that race on one receiver

    def __init__(
        self,
        *,
        queue_name: str | None = None,
        topic_name: str | None = None,
        subscription_name: str | None = None,
        azure_service_bus_conn_id: str = ServiceBusSharedStreamHook.default_conn_name,
        max_in_flight: int,
        max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES,
        max_wait_time: float = 5.0,
        session_enabled: bool = False,
        max_concurrent_sessions: int = 8,
        complete_in_ranges: bool = True,
    ) -> None:
        self._entity = Entity.of(queue_name, topic_name, subscription_name)
        super().__init__(max_in_flight=max_in_flight, stream_label=self._entity.identity)
        self._conn_id = azure_service_bus_conn_id
        self._max_payload_bytes = max_payload_bytes
        self._max_wait_time = float(max_wait_time)
        self._session_enabled = session_enabled
        self._max_sessions = max_concurrent_sessions
        self._complete_in_ranges = complete_in_ranges
        self._scrubber = SecretScrubber()
        self._config: ServiceBusClientConfig | None = None
        self._client: Any = None
        self._receiver: Any = None
        self._sessions: list[_SessionReceiver] = []
        self._session_of: dict[str, _SessionReceiver] = {}
        self._next_session_accept = 0.0
        self._registered: tuple[str, str] | None = None
        self._management: weakref.WeakKeyDictionary[Any, asyncio.Lock] = weakref.WeakKeyDictionary()
        """Per receiver: held by each of our ``$management`` requests (they must not race)."""
        self.lost_locks = 0
        """Settlements and renewals refused because the lock was gone (the message comes back)."""
        self.ranges_completed = 0
        """Runs of messages completed with one disposition each (:mod:`.ranges`)."""
        self.ranges_unconfirmed = 0
        """Runs whose outcome the broker did not confirm in time: completed one by one instead."""
        self.ranges_ignored = False
        """The broker left a delivery of a range unsettled: completing one by one from then on."""

    @property
    def entity(self) -> Entity:
        return self._entity

    @property
    def namespace(self) -> str | None:
        return self._config.namespace if self._config else None

    def held_sessions(self) -> list[str]:
        """The sessions this producer holds a lock on, in receive order (for logs and tests)."""
        return [str(session.session_id) for session in self._sessions]

    # -- connection -----------------------------------------------------------------------------

    async def connect(self) -> float:
        self._config = await ServiceBusSharedStreamHook(self._conn_id).aget_client_config()
        self._scrubber.add(*self._config.secrets)
        self._scrubber.install(*SDK_LOGGERS, __name__)
        self._claim_stream()
        try:
            self._client = self._config.make_client(
                retry_total=2, retry_backoff_factor=0.5, retry_mode="fixed"
            )
        except ServiceBusSharedStreamError:
            raise
        except Exception as exc:
            raise self._explain("open a client for", exc) from None
        if not self._session_enabled:
            self._receiver = self._new_receiver()
            # Receiving nothing opens the link: a missing entity or a refused credential fails
            # here, at stream start, with a clear error, instead of on the first message.
            await self._call("open the receiver of", self._receiver.peek_messages(max_message_count=1))
        log.info(
            "Service Bus shared stream open: namespace=%s entity=%s sessions=%s max_in_flight=%d",
            self._config.namespace,
            self._entity.path,
            self._session_enabled,
            self.credits.max_in_flight,
        )
        return ASSUMED_LOCK_SECONDS

    def _claim_stream(self) -> None:
        """
        Refuse a second producer for the same entity of the same namespace in this process.

        The stream key holds the namespace the connection resolves to, so two connections to one
        namespace are one stream. The key falls back to the connection id where the connection
        could not be read when the key was computed; then two streams may reach one entity, and
        competing consumers would silently split its messages. Both connections are resolved by
        now: the second one fails loudly instead.
        """
        assert self._config is not None
        key = (self._config.namespace, self._entity.identity)
        owner = _live_streams.get(key)
        if owner is not None and owner != self._conn_id:
            raise ServiceBusConfigurationError(
                f"Service Bus entity {self._entity.path!r} of namespace {self._config.namespace!r} is "
                f"already streamed through connection {owner!r}; watchers of one entity must use "
                f"the same connection (this one uses {self._conn_id!r}), or they would split its "
                "messages between two consumers"
            )
        _live_streams[key] = self._conn_id
        self._registered = key

    def _new_receiver(self, **kwargs: Any) -> Any:
        from azure.servicebus import ServiceBusReceiveMode

        common = {
            "receive_mode": ServiceBusReceiveMode.PEEK_LOCK,
            "prefetch_count": 0,
            "socket_timeout": RECEIVER_SOCKET_TIMEOUT_SECONDS,
            **kwargs,
        }
        if self._entity.queue_name is not None:
            return self._client.get_queue_receiver(self._entity.queue_name, **common)
        return self._client.get_subscription_receiver(
            self._entity.topic_name, self._entity.subscription_name, **common
        )

    async def disconnect(self) -> None:
        for session in self._sessions:
            await _close_quietly(session.receiver)
        self._sessions.clear()
        self._session_of.clear()
        if self._receiver is not None:
            await _close_quietly(self._receiver)
            self._receiver = None
        if self._client is not None:
            await _close_quietly(self._client)
            self._client = None
        if self._registered is not None and _live_streams.get(self._registered) == self._conn_id:
            del _live_streams[self._registered]
        self._registered = None

    # -- receiving ------------------------------------------------------------------------------

    async def receive(self, max_messages: int) -> Sequence[Delivery[Any]]:
        if not self._session_enabled:
            messages = await self._call(
                "receive from",
                self._receiver.receive_messages(
                    max_message_count=max_messages, max_wait_time=self._max_wait_time
                ),
            )
            deliveries = [self._delivery(message, self._receiver, lane=None) for message in messages]
        else:
            deliveries = await self._receive_sessions(max_messages)
        renew_in_time(self._leases, (self._lock_left(d) for d in deliveries))
        return deliveries

    @staticmethod
    def _lock_left(delivery: Delivery[Any]) -> float | None:
        received: _Received = delivery.handle
        session = received.receiver.session if received.session is not None else None
        return lock_left(received.message, session)

    async def _receive_sessions(self, max_messages: int) -> list[Delivery[Any]]:
        for session in [s for s in self._sessions if s.restarting]:
            await self._release_session(session)
        await self._accept_sessions()
        if not self._sessions:
            return []
        deliveries: list[Delivery[Any]] = []
        per_session = max(1, max_messages // len(self._sessions))
        for session in list(self._sessions):
            want = min(per_session, max_messages - len(deliveries))
            if want <= 0:
                break
            try:
                messages = await session.receiver.receive_messages(
                    max_message_count=want, max_wait_time=min(1.0, self._max_wait_time)
                )
            except Exception as exc:
                if _is_lock_lost(exc):
                    self._count_lost(f"session {session.session_id!r}", exc)
                    await self._release_session(session)
                    continue
                if _is_timeout(exc):
                    # The SDK re-attached a dropped session link and found no session: drop it.
                    log.debug("Session receiver of %s found no session; releasing it", self._entity.path)
                    await self._release_session(session)
                    continue
                raise self._explain("receive from", exc) from None
            if session.restarting:
                # A message of it was abandoned while this receive waited: what it brought is
                # later in the session, and closing the receiver gives it back.
                await self._release_session(session)
                continue
            session.idle_receives = 0 if messages else session.idle_receives + 1
            for message in messages:
                delivery = self._delivery(
                    message, session.receiver, lane=("session", session.session_id), session=session
                )
                session.in_flight.add(str(delivery.lease))
                deliveries.append(delivery)
            if session.idle_receives >= 3 and not session.in_flight:
                await self._release_session(session)
        return deliveries

    async def _accept_sessions(self) -> None:
        """
        Accept the next available sessions while there is room (a short wait each).

        A wait that found no free session is not repeated for ``SESSION_ACCEPT_RETRY_SECONDS``
        while the producer holds sessions: each wait costs a receive cycle up to a second, and
        the sessions already held must be read (and settled) well within their lock duration.
        """
        from azure.servicebus import NEXT_AVAILABLE_SESSION

        loop = asyncio.get_running_loop()
        if self._sessions and loop.time() < self._next_session_accept:
            return
        while len(self._sessions) < self._max_sessions:
            receiver = self._new_receiver(
                session_id=NEXT_AVAILABLE_SESSION,
                max_wait_time=1,
                prefetch_count=max(1, self.credits.max_in_flight // self._max_sessions),
            )
            try:
                await receiver.__aenter__()
            except Exception as exc:
                await _close_quietly(receiver)
                if not _is_timeout(exc):
                    raise self._explain("accept a session of", exc) from None
                session_id = None
            else:
                session_id = receiver.session.session_id
            if not isinstance(session_id, str):
                # No session was free. Service Bus answers the attach and then refuses it
                # (com.microsoft:timeout); the SDK can return such a receiver as if it held a
                # session, its id still the NEXT_AVAILABLE filter. It holds nothing: drop it.
                await _close_quietly(receiver)
                self._next_session_accept = loop.time() + SESSION_ACCEPT_RETRY_SECONDS
                if not self._sessions:
                    await asyncio.sleep(min(1.0, self._max_wait_time))
                return
            self._sessions.append(_SessionReceiver(receiver, session_id))
            log.debug("Accepted session %r of %s", session_id, self._entity.path)

    async def _release_session(self, session: _SessionReceiver) -> None:
        if session in self._sessions:
            self._sessions.remove(session)
        session.closed = True
        await _close_quietly(session.receiver)

    def _delivery(
        self, message: Any, receiver: Any, *, lane: Any, session: _SessionReceiver | None = None
    ) -> Delivery[Any]:
        assert self._config is not None
        body = message_body(message)
        raw = build_message(
            body,
            metadata=envelope_metadata(message, self._entity, self._config.namespace),
            label=self._label_of(message),
            max_payload_bytes=self._max_payload_bytes,
        )
        handle = _Received(message, receiver, session)
        return Delivery(
            message=raw,
            handle=handle,
            lease=str(message.lock_token),
            lane=lane,
            size=body_size(body),
            message_id=str(message.message_id),
        )

    # -- settlement -----------------------------------------------------------------------------

    async def ack(self, deliveries: Sequence[Delivery[Any]]) -> None:
        runs, alone = self._completion_runs(deliveries)
        await _all(
            [
                *(self._complete_run(run) for run in runs),
                *(self._settle_one("complete", d, lambda r, msg: r.complete_message(msg)) for d in alone),
            ]
        )

    def _completion_runs(
        self, deliveries: Sequence[Delivery[Any]]
    ) -> tuple[list[tuple[RangeLink, list[Delivery[Any]]]], list[Delivery[Any]]]:
        """
        Split an ACK batch into runs completed with one disposition each, and the rest.

        A run is consecutive deliveries of one receiver's current link (:mod:`.ranges`); what
        cannot join one (a lone message, one received on an earlier link, a locally expired
        lock, an SDK without what a range needs) is completed with ``complete_message``.
        """
        if not self._complete_in_ranges or self.ranges_ignored or len(deliveries) < MIN_RUN:
            return [], list(deliveries)
        if not message_supports_ranges(deliveries[0].handle.message):
            return [], list(deliveries)
        by_receiver: dict[int, list[Delivery[Any]]] = {}
        for delivery in deliveries:
            by_receiver.setdefault(id(delivery.handle.receiver), []).append(delivery)
        runs: list[tuple[RangeLink, list[Delivery[Any]]]] = []
        alone: list[Delivery[Any]] = []
        for group in by_receiver.values():
            link = range_link(group[0].handle.receiver)
            if link is None:
                alone.extend(group)
                continue
            joining: list[Delivery[Any]] = []
            for delivery in group:
                (joining if link.can_join(delivery.handle.message) else alone).append(delivery)
            group_runs, rest = split_runs(joining, lambda d: d.handle.message._delivery_id)
            runs.extend((link, run) for run in group_runs)
            alone.extend(rest)
        return runs, alone

    async def _complete_run(self, run: tuple[RangeLink, list[Delivery[Any]]]) -> None:
        """
        Complete one run with one disposition; a lost lock is counted, as for one message.

        A refused range says only that some delivery of it was refused: the ones Service Bus did
        complete are gone, the others come back when their locks run out (at-least-once either
        way), so it is counted once, not per message.
        """
        link, deliveries = run
        what = f"{len(deliveries)} messages ({self._label(deliveries[0])} to {self._label(deliveries[-1])})"
        left = [self._lock_left(d) for d in deliveries]
        known = [seconds for seconds in left if seconds is not None]
        try:
            await link.complete(
                [d.handle.message for d in deliveries], lock_seconds_left=min(known, default=None)
            )
            self.ranges_completed += 1
        except RangeUnconfirmed:
            self.ranges_unconfirmed += 1
            await self._complete_unconfirmed(what, deliveries)
        except Exception as exc:
            if _is_lock_lost(exc):
                # Which of them Service Bus completed is not known: the others come back.
                self._count_lost(f"complete of {what}", exc)
                return
            error = self._explain(f"complete {what}, settled as one range, of", exc)
            raise type(error)(
                f"{error}; complete_in_ranges=False completes them one by one instead"
            ) from None
        finally:
            for delivery in deliveries:
                self._forget_in_session(delivery)

    async def _complete_unconfirmed(self, what: str, deliveries: Sequence[Delivery[Any]]) -> None:
        """
        Complete, one by one, the messages of a range whose outcome did not come in time.

        Through ``complete_message``: the range took their tags off the link, so the SDK
        completes each through ``$management`` (one request at a time: they must not race on one
        receiver). A message the range did complete is refused as lock-lost, which is how a
        message the range did not complete is told from it; if any was still locked, the broker
        does not apply ranges, and the stream completes one by one from then on.
        """
        still_locked = 0
        for delivery in deliveries:
            received: _Received = delivery.handle
            try:
                async with self._management_of(received.receiver):
                    await received.receiver.complete_message(received.message)
            except Exception as exc:
                if not _is_lock_lost(exc):
                    raise self._explain("complete a message of", exc) from None
                # Completed by the range (or its lock is gone, and it comes back): nothing to do.
                log.debug("%s was already completed, or its lock is gone", self._label(delivery))
            else:
                still_locked += 1
        if still_locked and not self.ranges_ignored:
            self.ranges_ignored = True
            log.warning(
                "Service Bus did not complete %d of %s settled as one range; completed them one by "
                "one, and completing every message one by one from now on on this stream "
                "(complete_in_ranges=False says so up front)",
                still_locked,
                what,
            )

    async def redeliver(self, deliveries: Sequence[Delivery[Any]]) -> None:
        """Abandon; a session with an abandoned message is given up and taken again (module docstring)."""
        try:
            await _all(
                self._settle_one("abandon", d, lambda r, msg: r.abandon_message(msg)) for d in deliveries
            )
        finally:
            for delivery in deliveries:
                session = delivery.handle.session
                if session is not None:
                    session.restarting = True

    async def give_back(self, deliveries: Sequence[Delivery[Any]]) -> None:
        """Release messages no watcher has seen (their delivery count stays); abandon the rest."""
        rest = await self._release(deliveries)
        if rest:
            await self.redeliver(rest)

    async def release_unsettled(self, deliveries: Sequence[Delivery[Any]]) -> None:
        """On close, release what the stream holds; the rest comes back as its lock runs out."""
        await self._release(deliveries)

    async def _release(self, deliveries: Sequence[Delivery[Any]]) -> list[Delivery[Any]]:
        """
        Settle ``released`` (AMQP 1.0 section 3.4.4): available again at once, delivery count unchanged.

        An abandon, or a lock left to run out, counts a delivery against ``MaxDeliveryCount``;
        a message nobody processed must not spend one. The SDK has no public call for it, but
        releases messages this way itself (those that arrive while no receive waits), through
        the receiver's AMQP client: the same private calls :mod:`.ranges` checks for. Only a
        message held by its receiver's current link can be released there; session messages go
        back when their session receiver closes. Returns the deliveries it could not release.
        """
        rest: list[Delivery[Any]] = []
        for delivery in deliveries:
            received: _Received = delivery.handle
            message = received.message
            link = None
            if received.session is None and message_supports_ranges(message):
                link = range_link(received.receiver)
            if link is None or not link.can_join(message):
                rest.append(delivery)
                continue
            try:
                handler = link.handler
                await handler.settle_messages_async(message._delivery_id, message._delivery_tag, "released")
            except Exception as exc:
                log.debug("Releasing %s failed: %s", self._label(delivery), type(exc).__name__)
                rest.append(delivery)
                continue
            message._settled = True
        return rest

    async def dead_letter(self, letters: Sequence[DeadLetter[Any]]) -> None:
        await _all(self._dead_letter_one(letter) for letter in letters)

    async def _dead_letter_one(self, letter: DeadLetter[Any]) -> None:
        description = _cut(letter.description, DEAD_LETTER_DESCRIPTION_LIMIT)
        await self._settle_one(
            "dead-letter",
            letter.delivery,
            lambda r, msg: r.dead_letter_message(msg, reason=letter.reason, error_description=description),
        )
        log.info(
            "Dead-lettered %s (%s): %s", letter.delivery.message.label, letter.reason, letter.description
        )

    async def _settle_one(self, action: str, delivery: Delivery[Any], call: Any) -> None:
        received: _Received = delivery.handle
        if received.session is not None and received.session.closed:
            # Its session's receiver is closed (given up after an abandon, or its lock lost):
            # the service has the message back, at its place in the session.
            if action != "abandon":
                self.lost_locks += 1
                self.metrics.incr(m.LEASE_LOSSES)
                log.warning(
                    "Could not %s %s: its session's receiver is closed; Service Bus will redeliver it",
                    action,
                    self._label(delivery),
                )
            return
        try:
            await call(received.receiver, received.message)
        except Exception as exc:
            if _is_lock_lost(exc):
                self._count_lost(f"{action} of {self._label(delivery)}", exc)
                return
            raise self._explain(f"{action} a message of", exc) from None
        finally:
            self._forget_in_session(delivery)

    def _label_of(self, message: Any) -> str:
        """Secret-free identification of a received message for logs: ``entity#sequence``."""
        return f"{self._entity.path}#{message.sequence_number}"

    def _label(self, delivery: Delivery[Any]) -> str:
        """The label of a delivery's message, from its handle (a queued ACK keeps no message)."""
        received: _Received = delivery.handle
        return self._label_of(received.message)

    def _forget_in_session(self, delivery: Delivery[Any]) -> None:
        for session in self._sessions:
            session.in_flight.discard(str(delivery.lease))

    async def extend_leases(
        self, deliveries: Sequence[Delivery[Any]], seconds: float
    ) -> Collection[Delivery[Any]]:
        """
        Renew the locks: one ``renew-lock`` request per receiver for all its messages.

        The ``$management`` ``com.microsoft:renew-lock`` operation takes a list of lock tokens;
        the SDK's public ``renew_message_lock`` sends one token per request, and each request
        behind a pending receive waits for the receiver's socket timeout (module docstring), so
        a round over N held messages cost N such waits. Requests on one receiver go one after
        another, never together: the SDK fails management requests that race on one receiver
        ("Management Operation error occurred", then the handler shuts down). Receivers (each
        session has its own, on a connection of its own) are renewed together. Sessions renew
        their session's lock once per round (a session message's lock is its session's).
        """
        by_receiver: dict[int, list[Delivery[Any]]] = {}
        for delivery in deliveries:
            by_receiver.setdefault(id(delivery.handle.receiver), []).append(delivery)
        lost: list[Delivery[Any]] = []
        results = await asyncio.gather(
            *(self._renew_receiver(group) for group in by_receiver.values()), return_exceptions=True
        )
        for result in results:
            if isinstance(result, BaseException):
                raise result
            lost.extend(result)
        return lost

    def _management_of(self, receiver: Any) -> asyncio.Lock:
        """The lock our ``$management`` requests on ``receiver`` take, one at a time."""
        lock = self._management.get(receiver)
        if lock is None:
            lock = self._management[receiver] = asyncio.Lock()
        return lock

    async def _renew_receiver(self, group: Sequence[Delivery[Any]]) -> list[Delivery[Any]]:
        """Renew the locks of one receiver's messages (one request at a time); return the lost ones."""
        async with self._management_of(group[0].handle.receiver):
            return await self._renew_receiver_locked(group)

    async def _renew_receiver_locked(self, group: Sequence[Delivery[Any]]) -> list[Delivery[Any]]:
        receiver = group[0].handle.receiver
        session = group[0].handle.session
        if session is not None and session.closed:
            return []  # given up: the service has them back, nothing to renew
        if not self._session_enabled:
            if await self._renew_together(receiver, group):
                return []
            return await self._renew_one_by_one(group)
        try:
            renew_in_time(self._leases, [seconds_until(await receiver.session.renew_lock())])
        except Exception as exc:
            if not _is_lock_lost(exc):
                raise self._explain("renew a lock on", exc) from None
            self._count_lost(f"session lock renewal of {self._label(group[0])}", exc, metric=False)
            return list(group)
        return []

    async def _renew_together(self, receiver: Any, group: Sequence[Delivery[Any]]) -> bool:
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
            if _is_lock_lost(exc):
                log.debug("A lock of %d renewed together was lost; renewing one by one", len(group))
                return False
            raise self._explain("renew the locks on", exc) from None
        expirations = list(answer.get(MGMT_RESPONSE_MESSAGE_EXPIRATION) or ())
        if len(expirations) != len(group):
            return False
        for delivery, expiry_ms in zip(group, expirations, strict=True):
            delivery.handle.message._expiry = utc_from_timestamp(expiry_ms / 1000.0)
        renew_in_time(self._leases, (self._lock_left(d) for d in group))
        return True

    async def _renew_one_by_one(self, group: Sequence[Delivery[Any]]) -> list[Delivery[Any]]:
        lost: list[Delivery[Any]] = []
        for delivery in group:
            received: _Received = delivery.handle
            try:
                expiry = await received.receiver.renew_message_lock(received.message)
                renew_in_time(self._leases, [seconds_until(expiry)])
            except Exception as exc:
                if _is_lock_lost(exc):
                    # Returned as lost: the lease keeper counts it (lease_losses) and stops renewing.
                    self._count_lost(f"lock renewal of {self._label(delivery)}", exc, metric=False)
                    lost.append(delivery)
                    continue
                raise self._explain("renew a lock on", exc) from None
        return lost

    def _count_lost(self, what: str, exc: BaseException, *, metric: bool = True) -> None:
        self.lost_locks += 1
        if metric:
            self.metrics.incr(m.LEASE_LOSSES)
        log.warning(
            "Lock lost on %s (%s); Service Bus will redeliver the message",
            what,
            self._scrubber.describe(exc),
        )

    # -- errors ---------------------------------------------------------------------------------

    async def _call(self, action: str, awaitable: Any) -> Any:
        try:
            return await awaitable
        except ServiceBusSharedStreamError:
            raise
        except Exception as exc:
            raise self._explain(action, exc) from None

    def _explain(self, action: str, exc: BaseException) -> ServiceBusSharedStreamError:
        """Turn an SDK error into one naming the problem, the entity and the connection; no secret."""
        from azure.servicebus.exceptions import (
            MessagingEntityNotFoundError,
            ServiceBusAuthenticationError,
            ServiceBusAuthorizationError,
            ServiceBusCommunicationError,
            ServiceBusConnectionError,
        )

        where = f"Service Bus entity {self._entity.path!r} of namespace {self.namespace!r}"
        detail = self._scrubber.describe(exc)
        if (
            isinstance(exc, MessagingEntityNotFoundError)
            or "not-found" in detail
            or "could not be found" in detail
        ):
            return ServiceBusEntityNotFoundError(
                f"{where} does not exist (connection {self._conn_id!r}): {detail}"
            )
        if isinstance(
            exc, ServiceBusAuthenticationError | ServiceBusAuthorizationError
        ) or UNAUTHORIZED_STATUS.search(detail):
            return ServiceBusAccessError(
                f"Service Bus refused the credential of connection {self._conn_id!r} "
                f"to {action} {where}: {detail}"
            )
        if isinstance(exc, ServiceBusCommunicationError | ServiceBusConnectionError | OSError):
            return ServiceBusEndpointError(
                f"could not {action} {where} through connection {self._conn_id!r}: the namespace did "
                f"not answer as Service Bus ({detail})"
            )
        if isinstance(exc, ValueError):
            return ServiceBusConfigurationError(
                f"connection {self._conn_id!r} cannot {action} {where}: {detail}"
            )
        return ServiceBusSharedStreamError(f"could not {action} {where}: {detail}")


@dataclass(slots=True)
class _Received:
    """A received message, the receiver that must settle it, and its session (if any)."""

    message: Any
    receiver: Any
    session: _SessionReceiver | None = None


async def _all(settlements: Iterable[Awaitable[None]]) -> None:
    """
    Run settlements together; once every one has finished, raise the first failure.

    Waiting for all before raising leaves no settlement running behind a failed advance (the
    group fails, and the broker redelivers whatever was not settled).
    """
    results = await asyncio.gather(*settlements, return_exceptions=True)
    for result in results:
        if isinstance(result, BaseException):
            raise result


def _is_lock_lost(exc: BaseException) -> bool:
    from azure.servicebus.exceptions import MessageLockLostError, SessionLockLostError

    if isinstance(exc, MessageLockLostError | SessionLockLostError):
        return True
    return "lock-lost" in str(exc) or "lock has expired" in str(exc)


def _is_timeout(exc: BaseException) -> bool:
    from azure.servicebus.exceptions import OperationTimeoutError

    return isinstance(exc, OperationTimeoutError)


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


async def _close_quietly(closable: Any) -> None:
    try:
        await closable.close()
    except Exception as exc:  # closing is best effort; the lock runs out on the broker
        log.debug("Closing %s failed: %s", type(closable).__name__, type(exc).__name__)
