"""
The Service Bus half of a shared stream: one peek-lock receiver per entity, on the leased-queue template.

===========  ===============================================================================
ACK          one disposition ``accepted`` per run of consecutive deliveries
             (:mod:`.ranges`), ``complete_message`` for a message that is not in such a run
REDELIVER    ``abandon_message``: available again at once, its delivery count + 1
             (a message no watcher has seen, given back: AMQP ``released``, or its session's
             receiver closed; count unchanged)
DEAD-LETTER  ``dead_letter_message`` with ``reason`` (``rejected`` or ``unprocessable``) and an
             ``error_description`` naming the watcher whose ``reject`` refused it, or the cause
===========  ===============================================================================

Every settlement goes through the receiver that received it (a peek-lock token is only valid
there). The SDK waits for each settlement's outcome, and a frame can only be written between the
reads of a receive pending on the same socket, each up to the receiver's socket timeout. So the
receivers use a short socket timeout (``RECEIVER_SOCKET_TIMEOUT_SECONDS``), the settlements of a
batch are sent and awaited together (at most ``settle_batch_limit``), and unordered ACKs are
coalesced across advances by the template's ACK batcher and sent in the background, one batch at
a time, while the next receive goes out. Outcomes are still awaited: a complete the service
refused (the lock was lost) is counted (``lease_losses``) and logged, and the message comes back.

While a message waits for its trigger events to be persisted, the template's lease keeper
renews its lock (:mod:`.locks`). On a session-enabled entity each session is an ordered lane
(:mod:`.sessions`); without sessions there is no order to keep: the messages of one receive call
share an advance lane.
"""

from __future__ import annotations

import asyncio
import importlib.metadata
import logging
from collections.abc import Awaitable, Collection, Iterable, Sequence
from typing import Any

from airflow_shared_stream.common import metrics as m
from airflow_shared_stream.common.errors import SecretScrubber, require_sdk
from airflow_shared_stream.common.leased_queue import DeadLetter, Delivery, LeasedQueueProducer
from airflow_shared_stream.common.matching import body_size, build_message
from airflow_shared_stream.common.trigger import DEFAULT_MAX_PAYLOAD_BYTES
from airflow_shared_stream.servicebus import completion, locks, sessions
from airflow_shared_stream.servicebus.completion import RangeCompleter
from airflow_shared_stream.servicebus.envelope import envelope_metadata, message_body
from airflow_shared_stream.servicebus.errors import (
    ServiceBusConfigurationError,
    ServiceBusSharedStreamError,
    is_lock_lost,
    require_sdk_version,
)
from airflow_shared_stream.servicebus.errors import (
    explain as explain_sdk_error,
)
from airflow_shared_stream.servicebus.hook import Entity, ServiceBusClientConfig, ServiceBusSharedStreamHook
from airflow_shared_stream.servicebus.locks import (
    ASSUMED_LOCK_SECONDS,
    LockRenewer,
    delivery_lock_left,
    renew_in_time,
)
from airflow_shared_stream.servicebus.ranges import message_supports_ranges, range_link
from airflow_shared_stream.servicebus.sessions import (
    ReceivedMessage,
    SessionReceiver,
    SessionReceivers,
    close_quietly,
)

require_sdk("azure.servicebus", "servicebus")
require_sdk_version(importlib.metadata.version("azure-servicebus"))  # its metadata: no import on the loop

log = logging.getLogger(__name__)

SETTLE_BATCH_LIMIT = 100
"""Most messages per ACK, abandon, dead-letter or lock-renewal batch (the ACK batcher's batch)."""

RECEIVER_SOCKET_TIMEOUT_SECONDS = 0.02
"""Socket timeout of the receivers (the SDK's ``socket_timeout``): the longest a settlement waits
behind a pending receive, which holds the socket lock for that long per read round (shorter rounds
cost CPU, never data; docs/benchmarks.rst)."""

ACK_SENDS_IN_FLIGHT = 1
"""ACK batches sent in the background at once on a stream: one. A second batch of outcome
waiters on the same connection reads the first one's outcomes and waits the socket timeout out
more often."""

DEAD_LETTER_DESCRIPTION_LIMIT = 4096
"""Service Bus limits a dead-letter description; longer ones are cut (with an ellipsis)."""

SDK_LOGGERS = ("azure.servicebus", "azure.core", "azure.identity")
"""Loggers the secret scrubber is attached to: the SDK logs connection details itself."""

STREAM_LOGGERS = (__name__, sessions.__name__, locks.__name__, completion.__name__)
"""This package's loggers that log SDK error text: scrubbed too."""

_live_streams: dict[tuple[str, str], str] = {}
"""(namespace, entity) -> connection id of the producer reading it in this triggerer process."""


class ServiceBusSharedStreamProducer(LeasedQueueProducer[Any]):
    """
    Receive from one queue or subscription for every watcher that shares it; settle per the table.

    Built by :meth:`ServiceBusSharedStreamTrigger.create_shared_stream_producer` from the first
    watcher's arguments; connects only in :meth:`open_stream`. The handle of each delivery is
    the SDK's ``ServiceBusReceivedMessage``, settled with the receiver that received it.
    """

    broker = "servicebus"
    sdk_modules = tuple(f"azure.servicebus{part}" for part in ("", ".aio", ".amqp", ".exceptions"))
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
        self._max_in_flight = max_in_flight
        self._conn_id = azure_service_bus_conn_id
        self._max_payload_bytes = max_payload_bytes
        self._max_wait_time = float(max_wait_time)
        self._session_enabled = session_enabled
        self._scrubber = SecretScrubber()
        self._config: ServiceBusClientConfig | None = None
        self._client: Any = None
        self._receiver: Any = None
        self._locks = LockRenewer(sessions=session_enabled, owner=self)
        self._sessions = SessionReceivers(
            entity_path=self._entity.path,
            max_sessions=max_concurrent_sessions,
            max_wait_time=self._max_wait_time,
            prefetch=max(1, max_in_flight // max_concurrent_sessions),
            open_receiver=self._new_receiver,
            owner=self,
            management_of=self._locks.management_of,
        )
        self._ranges = RangeCompleter(
            enabled=complete_in_ranges,
            management_of=self._locks.management_of,
            owner=self,
            settled=self._forget_in_session,
        )
        self._registered: tuple[str, str] | None = None
        self.lost_locks = 0
        """Settlements and renewals refused because the lock was gone (the message comes back)."""

    @property
    def entity(self) -> Entity:
        return self._entity

    @property
    def namespace(self) -> str | None:
        return self._config.namespace if self._config else None

    @property
    def ranges_completed(self) -> int:
        """Runs of messages completed with one disposition each (:mod:`.ranges`)."""
        return self._ranges.completed

    @property
    def ranges_unconfirmed(self) -> int:
        """Runs whose outcome the broker did not confirm in time: completed one by one instead."""
        return self._ranges.unconfirmed

    @property
    def ranges_ignored(self) -> bool:
        """The broker left a delivery of a range unsettled: completing one by one from then on."""
        return self._ranges.ignored

    def held_sessions(self) -> list[str]:
        """The sessions this producer holds a lock on, in receive order (for logs and tests)."""
        return self._sessions.ids()

    # -- connection -----------------------------------------------------------------------------

    async def connect(self) -> float:
        self._config = await ServiceBusSharedStreamHook(self._conn_id).aget_client_config()
        self._scrubber.add(*self._config.secrets)
        self._scrubber.install(*SDK_LOGGERS, *STREAM_LOGGERS)
        self._claim_stream()
        try:
            self._client = self._config.make_client(
                retry_total=2, retry_backoff_factor=0.5, retry_mode="fixed"
            )
        except ServiceBusSharedStreamError:
            raise
        except Exception as exc:
            raise self.explain("open a client for", exc) from None
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
            self._max_in_flight,
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
        await self._sessions.close()
        if self._receiver is not None:
            await close_quietly(self._receiver)
            self._receiver = None
        if self._client is not None:
            await close_quietly(self._client)
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
            deliveries = await self._sessions.receive(max_messages, self._session_delivery)
        renew_in_time(self._leases, (delivery_lock_left(d) for d in deliveries))
        return deliveries

    taken_back = staticmethod(sessions.session_closed)

    def _session_delivery(self, message: Any, session: SessionReceiver) -> Delivery[Any]:
        return self._delivery(
            message, session.receiver, lane=("session", session.session_id), session=session
        )

    def _delivery(
        self, message: Any, receiver: Any, *, lane: Any, session: SessionReceiver | None = None
    ) -> Delivery[Any]:
        assert self._config is not None
        body = message_body(message)
        raw = build_message(
            body,
            metadata=envelope_metadata(message, self._entity, self._config.namespace),
            label=self._label_of(message),
            max_payload_bytes=self._max_payload_bytes,
        )
        handle = ReceivedMessage(message, receiver, session)
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
        runs, alone = self._ranges.runs(deliveries)
        await _all(
            [
                *(self._ranges.complete(run) for run in runs),
                *(self._settle_one("complete", d, lambda r, msg: r.complete_message(msg)) for d in alone),
            ]
        )

    async def redeliver(self, deliveries: Sequence[Delivery[Any]]) -> None:
        """
        Abandon; a session with an abandoned message is given up and taken again (module docstring).

        A message of a session already being given up is not abandoned (that would count a
        delivery): closing the session's receiver returns it, count unchanged, behind the
        abandoned one. It is a message held back behind its session's redelivery, nobody saw it.
        """
        heads = sessions.first_of_each_session(deliveries)
        abandon = [d for d in deliveries if d.handle.session is None] + list(heads.values())
        for session in heads:
            session.abandoning += 1
        try:
            await _all(self._settle_one("abandon", d, lambda r, msg: r.abandon_message(msg)) for d in abandon)
        finally:
            for delivery in deliveries:
                session = delivery.handle.session
                if session is not None:
                    session.restarting = True
                    self._forget_in_session(delivery)
            for session in heads:
                session.abandoning -= 1
                session.abandons_done.set()

    async def give_back(self, deliveries: Sequence[Delivery[Any]]) -> None:
        """
        Return messages no watcher has seen with their delivery count unchanged: ``released``,
        or, for a session's, by giving the session up (closing its receiver returns all it holds,
        uncounted; its lane is idle, so nothing of it is in flight). Abandon what ``released``
        cannot reach.
        """
        rest = await self._release([d for d in deliveries if d.handle.session is None])
        if rest:
            await self.redeliver(rest)
        for delivery in deliveries:
            if delivery.handle.session is not None:
                # Given up at the next receive (a receive may be waiting on its receiver now).
                delivery.handle.session.restarting = True
                self._forget_in_session(delivery)

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
            received: ReceivedMessage = delivery.handle
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
                log.debug("Releasing %s failed: %s", self.label(delivery), type(exc).__name__)
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
        received: ReceivedMessage = delivery.handle
        if received.session is not None and received.session.closed:
            # Its session's receiver is closed (given up after an abandon, or its lock lost):
            # the service has the message back, at its place in the session.
            if action != "abandon":
                self.lost_locks += 1
                self.metrics.incr(m.LEASE_LOSSES)
                log.warning(
                    "Could not %s %s: its session's receiver is closed; Service Bus will redeliver it",
                    action,
                    self.label(delivery),
                )
            return
        try:
            await call(received.receiver, received.message)
        except Exception as exc:
            if is_lock_lost(exc):
                self.lock_lost(f"{action} of {self.label(delivery)}", exc)
                return
            raise self.explain(f"{action} a message of", exc) from None
        finally:
            self._forget_in_session(delivery)

    def _label_of(self, message: Any) -> str:
        """Secret-free identification of a received message for logs: ``entity#sequence``."""
        return f"{self._entity.path}#{message.sequence_number}"

    def label(self, delivery: Delivery[Any]) -> str:
        """The label of a delivery's message, from its handle (a queued ACK keeps no message)."""
        received: ReceivedMessage = delivery.handle
        return self._label_of(received.message)

    def _forget_in_session(self, delivery: Delivery[Any]) -> None:
        self._sessions.forget(str(delivery.lease))

    async def extend_leases(
        self, deliveries: Sequence[Delivery[Any]], seconds: float
    ) -> Collection[Delivery[Any]]:
        """Renew the locks (:class:`~.locks.LockRenewer`), planning the next pass from their expiries."""
        return await self._locks.renew(deliveries, self._leases)

    def lock_lost(self, what: str, exc: BaseException, *, counted_elsewhere: bool = False) -> None:
        """A settlement or renewal refused because the lock was gone (:class:`~.parts.StreamOwner`)."""
        self.lost_locks += 1
        if not counted_elsewhere:
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
            raise self.explain(action, exc) from None

    def explain(self, action: str, exc: BaseException) -> ServiceBusSharedStreamError:
        """The stream's secret-free error for an SDK error (:class:`~.parts.StreamOwner`)."""
        return explain_sdk_error(
            action,
            exc,
            entity=self._entity.path,
            namespace=self.namespace,
            conn_id=self._conn_id,
            scrubber=self._scrubber,
        )


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


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"
