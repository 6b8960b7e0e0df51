"""
Redrive from a Service Bus entity's ``$deadletterqueue`` sub-queue to the entity (common/redrive.py).

Each dead-lettered message is received with a peek-lock, sent again with its body, application
properties, session id, correlation id, subject and content type, and completed in the
dead-letter sub-queue only after the send returned. The copy gets a **new message id**: on an
entity with duplicate detection, a send that reuses an id seen within the window is accepted and
dropped, and the dead letter would then be completed with no copy anywhere. The new id is derived
from the dead letter's sequence number, so a redrive killed between send and complete sends the
same id again (dropped as a duplicate where detection is on); the original id is kept in the
application property ``shared_stream_original_message_id``.

Copies are sent in batches the sender's link accepts (``create_message_batch``: 256 KiB on a
Standard namespace); a copy too large on its own stays in the dead-letter sub-queue.

Where a message goes needs no stamp of ours: an entity's dead-letter sub-queue holds only that
entity's dead letters (ours, and the service's own after ``MaxDeliveryCount``), so every one
goes home.

Where a copy goes: Service Bus sends only to queues and topics, never to one subscription. A
queue's dead letters go back to the queue. A subscription's go to its **topic**, which delivers
them to every subscription whose rules match, not only the one they were dead-lettered from; the
copy carries the application property ``shared_stream_redrive_subscription`` naming that
subscription, so the topic's other subscriptions can leave it out with a rule
(``shared_stream_redrive_subscription IS NULL OR shared_stream_redrive_subscription = '<name>'``).

Service Bus keeps why a message was dead-lettered in two application properties of the message,
``DeadLetterReason`` and ``DeadLetterErrorDescription`` (what our triggers' reject writes there).
The copy leaves them out, unless ``keep_origin_attributes``.

The snapshot is a time: a dead letter enqueued after the redrive started (a copy dead-lettered
again) is held and given back at the end, never examined. Held messages' locks are renewed at a
third of the lock the broker granted (``locked_until_utc`` of the last read).
"""

from __future__ import annotations

import datetime
import logging
import uuid
from collections.abc import Sequence
from typing import Any

from airflow_shared_stream.common.errors import SecretScrubber
from airflow_shared_stream.common.matching import build_message
from airflow_shared_stream.common.redrive import RedriveItem, RedriveRoute, RedriveSnapshot
from airflow_shared_stream.common.trigger import DEFAULT_MAX_PAYLOAD_BYTES
from airflow_shared_stream.servicebus.errors import (
    ServiceBusConfigurationError,
    ServiceBusEntityNotFoundError,
    ServiceBusSharedStreamError,
)
from airflow_shared_stream.servicebus.hook import ServiceBusClientConfig, ServiceBusSharedStreamHook
from airflow_shared_stream.servicebus.producer import Entity, envelope_metadata, message_body

log = logging.getLogger(__name__)

REDRIVE_SUBSCRIPTION_PROPERTY = "shared_stream_redrive_subscription"
ORIGINAL_MESSAGE_ID_PROPERTY = "shared_stream_original_message_id"
"""The message id of what was dead-lettered, on its copy (which has an id of its own)."""
_COPY_ID_NAMESPACE = uuid.UUID("6f1c3f52-6a0e-4c55-9d0f-3f7d2f8b4a41")
ORIGIN_PROPERTIES = frozenset(("DeadLetterReason", "DeadLetterErrorDescription"))
"""Where Service Bus keeps a dead-lettering's reason (stripped unless ``keep_origin_attributes``)."""
RECEIVE_WAIT_SECONDS = 2.0
FIRST_LOCK_SECONDS = 30.0
"""The lock assumed until a read says what the broker grants (Service Bus's least is 5 s)."""
_SUBSCRIPTIONS = "/subscriptions/"


def parse_entity(source: str | None) -> Entity:
    """``queue`` or ``topic/Subscriptions/subscription`` (any case) as an :class:`Entity`."""
    if not source or not isinstance(source, str):
        raise ServiceBusConfigurationError(
            "a Service Bus redrive needs the entity whose dead letters it moves (source='<queue>' "
            "or source='<topic>/Subscriptions/<subscription>')"
        )
    path = source.strip().strip("/")
    lower = path.lower()
    if _SUBSCRIPTIONS in lower:
        at = lower.index(_SUBSCRIPTIONS)
        return Entity.of(None, path[:at], path[at + len(_SUBSCRIPTIONS) :])
    return Entity.of(path, None, None)


class ServiceBusDeadLetterSource:
    """
    Receive from ``source``'s dead-letter sub-queue; send to the queue or topic; complete.

    :param source: ``<queue>`` or ``<topic>/Subscriptions/<subscription>``.
    :param dead_letter: not needed (the sub-queue is the entity's); if given, it must name it.
    """

    broker = "servicebus"

    def __init__(
        self,
        *,
        source: str | None,
        dead_letter: str | None = None,
        conn_id: str | None = None,
        keep_origin_attributes: bool = False,
    ) -> None:
        self._entity = parse_entity(source)
        if dead_letter and dead_letter.strip("/").lower() not in (
            self._entity.identity,
            f"{self._entity.identity}/$deadletterqueue",
        ):
            raise ServiceBusConfigurationError(
                f"dead_letter={dead_letter!r} is not the dead-letter sub-queue of {self._entity.path!r}: "
                "a Service Bus redrive moves an entity's own dead letters; leave dead_letter out"
            )
        self._conn_id = conn_id or ServiceBusSharedStreamHook.default_conn_name
        self._keep = keep_origin_attributes
        self._config: ServiceBusClientConfig | None = None
        self._scrubber = SecretScrubber()
        self._client: Any = None
        self._receiver: Any = None
        self._sender: Any = None
        self._started: datetime.datetime | None = None
        self.lease_seconds = FIRST_LOCK_SECONDS
        self.label = self._entity.path + "/$deadletterqueue"

    @property
    def route(self) -> RedriveRoute:
        """Never a loop: the sub-queue is the entity's own, and nothing sent lands there."""
        return RedriveRoute(
            "entity",
            read_from=f"{self._entity.identity}/$deadletterqueue",
            write_to=self._entity.queue_name or self._entity.topic_name,
        )

    async def open(self) -> None:
        from azure.servicebus import ServiceBusReceiveMode, ServiceBusSubQueue

        self._config = config = await ServiceBusSharedStreamHook(self._conn_id).aget_client_config()
        self._scrubber.add(*config.secrets)
        self._scrubber.install("azure", "uamqp", "azure.servicebus")
        entity = self._entity
        try:
            self._client = client = config.make_client(
                retry_total=2, retry_backoff_factor=0.5, retry_mode="fixed"
            )
            common = {
                "sub_queue": ServiceBusSubQueue.DEAD_LETTER,
                "receive_mode": ServiceBusReceiveMode.PEEK_LOCK,
                "prefetch_count": 0,
            }
            if entity.queue_name is not None:
                self._receiver = client.get_queue_receiver(entity.queue_name, **common)
                self._sender = client.get_queue_sender(entity.queue_name)
            else:
                self._receiver = client.get_subscription_receiver(
                    entity.topic_name, entity.subscription_name, **common
                )
                self._sender = client.get_topic_sender(entity.topic_name)
            await self._receiver.__aenter__()
            await self._sender.__aenter__()
        except Exception as exc:
            raise self._explain("open", exc) from None

    async def close(self) -> None:
        for handler in (self._sender, self._receiver, self._client):
            if handler is not None:
                try:
                    await handler.close()
                except Exception as exc:  # best effort: the redrive is over
                    log.debug("Closing a Service Bus handler failed: %s", type(exc).__name__)
        self._sender = self._receiver = self._client = None

    async def snapshot(self) -> RedriveSnapshot:
        self._started = datetime.datetime.now(datetime.timezone.utc)
        return RedriveSnapshot(depth=None, bound=f"dead letters enqueued before {self._started.isoformat()}")

    def held_handle(self, item: RedriveItem) -> Any:
        """The SDK renews and abandons by the received message itself."""
        return item.handle

    async def renew(self, items: Sequence[RedriveItem]) -> None:
        for item in items:
            try:
                await self._receiver.renew_message_lock(item.handle)
            except Exception as exc:  # a lost lock: it is handed out again and recognised by key
                log.debug("Could not renew the lock of %s: %s", item.key, type(exc).__name__)

    async def read(self, limit: int) -> Sequence[RedriveItem]:
        try:
            messages = await self._receiver.receive_messages(
                max_message_count=limit, max_wait_time=RECEIVE_WAIT_SECONDS
            )
        except Exception as exc:
            raise self._explain("receive from", exc) from None
        assert self._config is not None
        items = []
        for message in messages:
            envelope = build_message(
                message_body(message),
                metadata=envelope_metadata(message, self._entity, self._config.namespace),
                label=f"{self.label}/{message.sequence_number}",
                max_payload_bytes=DEFAULT_MAX_PAYLOAD_BYTES,
            ).envelope
            enqueued = message.enqueued_time_utc
            past = self._started is not None and enqueued is not None and enqueued > self._started
            items.append(
                RedriveItem(
                    key=str(message.sequence_number), envelope=envelope, handle=message, past_snapshot=past
                )
            )
            self._learn_lock(message)
        return items

    def _learn_lock(self, message: Any) -> None:
        """The lock the broker granted, from the message (FAULT_MODEL 5: what the broker says)."""
        until = message.locked_until_utc
        if until is not None:
            granted = (until - datetime.datetime.now(datetime.timezone.utc)).total_seconds()
            self.lease_seconds = max(1.0, min(self.lease_seconds, granted))

    def _copy_of(self, message: Any) -> Any:
        from azure.servicebus import ServiceBusMessage

        properties = dict(message.application_properties or {})
        properties = {(k.decode() if isinstance(k, bytes) else k): v for k, v in properties.items()}
        if not self._keep:
            properties = {k: v for k, v in properties.items() if k not in ORIGIN_PROPERTIES}
        if self._entity.subscription_name is not None:
            properties[REDRIVE_SUBSCRIPTION_PROPERTY] = self._entity.subscription_name
        if message.message_id is not None:
            properties.setdefault(ORIGINAL_MESSAGE_ID_PROPERTY, str(message.message_id))
        body = message_body(message)
        return ServiceBusMessage(
            body if body is not None else b"",
            application_properties=properties or None,
            session_id=message.session_id,
            message_id=self._copy_id(message),
            content_type=message.content_type,
            correlation_id=message.correlation_id,
            subject=message.subject,
            to=message.to,
            reply_to=message.reply_to,
            reply_to_session_id=message.reply_to_session_id,
        )

    def _copy_id(self, message: Any) -> str:
        """A new id, the same for every redrive of this dead letter (its entity and sequence number)."""
        return str(uuid.uuid5(_COPY_ID_NAMESPACE, f"{self.label.lower()}/{message.sequence_number}"))

    async def copy(self, items: Sequence[RedriveItem]) -> Sequence[RedriveItem]:
        accepted: list[RedriveItem] = []
        batch, in_batch = await self._new_batch(), list[RedriveItem]()
        for item in items:
            copy = self._copy_of(item.handle)
            if not self._add(batch, copy):
                if in_batch:
                    accepted.extend(await self._send(batch, in_batch))
                    batch, in_batch = await self._new_batch(), list[RedriveItem]()
                if not self._add(batch, copy):
                    log.warning(
                        "The copy of %s is larger than %s accepts (%d bytes): it stays in %s",
                        item.key,
                        self._entity.path,
                        batch.max_size_in_bytes,
                        self.label,
                    )
                    continue
            in_batch.append(item)
        if in_batch:
            accepted.extend(await self._send(batch, in_batch))
        return accepted

    async def _new_batch(self) -> Any:
        try:
            return await self._sender.create_message_batch()
        except Exception as exc:
            raise self._explain("send to", exc) from None

    @staticmethod
    def _add(batch: Any, copy: Any) -> bool:
        from azure.servicebus.exceptions import MessageSizeExceededError

        try:
            batch.add_message(copy)
        except MessageSizeExceededError:
            return False
        return True

    async def _send(self, batch: Any, items: Sequence[RedriveItem]) -> Sequence[RedriveItem]:
        try:
            await self._sender.send_messages(batch)
        except Exception as exc:
            log.warning("Service Bus refused %d copy(ies): %s", len(items), self._explain("send to", exc))
            return []
        return items

    async def remove(self, moved: Sequence[RedriveItem], skipped: Sequence[RedriveItem]) -> None:
        for item in moved:
            try:
                await self._receiver.complete_message(item.handle)
            except Exception as exc:  # a lost lock: the message is redriven again (a duplicate)
                log.warning(
                    "Could not complete %s after its copy: %s", item.key, self._explain("complete in", exc)
                )

    async def release(self, items: Sequence[RedriveItem]) -> None:
        for item in items:
            try:
                await self._receiver.abandon_message(item.handle)
            except Exception as exc:  # its lock runs out anyway
                log.debug("Could not abandon %s: %s", item.key, type(exc).__name__)

    def _explain(self, action: str, exc: BaseException) -> ServiceBusSharedStreamError:
        from azure.servicebus.exceptions import MessagingEntityNotFoundError

        namespace = self._config.namespace if self._config is not None else "?"
        where = f"Service Bus entity {self._entity.path!r} of namespace {namespace!r}"
        detail = self._scrubber.describe(exc)
        if isinstance(exc, MessagingEntityNotFoundError) or "not-found" in detail:
            return ServiceBusEntityNotFoundError(
                f"{where} does not exist (connection {self._conn_id!r}): {detail}"
            )
        if isinstance(exc, ServiceBusSharedStreamError):
            return exc
        return ServiceBusSharedStreamError(
            f"cannot {action} {where} (connection {self._conn_id!r}): {detail}"
        )


def dead_letter_source(**kwargs: Any) -> ServiceBusDeadLetterSource:
    return ServiceBusDeadLetterSource(**kwargs)
