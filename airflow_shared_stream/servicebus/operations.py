"""
What the Streams page, redrive and the ``shared+servicebus`` scheme ask of Service Bus.

:class:`~airflow_shared_stream.common.operations.BrokerOperations`, in Service Bus's words.

The dead-letter depth is the entity's ``dead_letter_message_count``, one GET of its runtime
properties on the namespace's HTTPS/ATOM management endpoint (a count: no message is read). The
endpoint needs ``Manage`` rights, and the development emulator's connection string reaches an
endpoint that does not answer it: for a connection the endpoint refuses (401, 403), and for the
emulator's when the endpoint does not answer, the depth falls back to peeking the
``$deadletterqueue`` (a peek neither locks nor counts as a delivery), at most
:data:`PEEK_LIMIT` messages. A namespace whose endpoint does not answer is an error.

A redrive reads the entity's own ``$deadletterqueue``: a stream names no dead-letter destination.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from azure.core.exceptions import HttpResponseError, ServiceRequestError, ServiceResponseError
from azure.servicebus import ServiceBusSubQueue

from airflow_shared_stream.common.operations import Backlog, BrokerOperations, DepthRead
from airflow_shared_stream.common.redrive import DeadLetterSource
from airflow_shared_stream.servicebus.hook import Entity, ServiceBusClientConfig, ServiceBusSharedStreamHook
from airflow_shared_stream.servicebus.redrive import dead_letter_source, parse_entity
from airflow_shared_stream.servicebus.trigger import ServiceBusSharedStreamTrigger

PEEK_LIMIT = 1000
"""The emulator's fallback counts a dead-letter sub-queue up to this many (shown as "1000+")."""
PEEK_BATCH = 250
REFUSED_STATUSES = (401, 403)
"""The management endpoint refuses a connection without ``Manage`` rights: it is counted by peeking."""


def entity_path(trigger_kwargs: Mapping[str, Any]) -> str:
    """``<queue>`` or ``<topic>/Subscriptions/<subscription>``: how a redrive names the entity."""
    if trigger_kwargs.get("queue_name"):
        return str(trigger_kwargs["queue_name"])
    return f"{trigger_kwargs.get('topic_name')}/Subscriptions/{trigger_kwargs.get('subscription_name')}"


def dead_letter_depth(conn_id: str, entity_path: str) -> DepthRead:
    """``{"depth": n}`` of an entity's ``$deadletterqueue`` (``"at_least": True`` past the limit)."""
    return DepthRead(
        ("servicebus:" + conn_id, entity_path, ""),
        "a Service Bus dead-letter depth",
        lambda: _runtime_count(conn_id, entity_path),
        ("azure.servicebus.aio", "azure.servicebus.aio.management"),
    )


async def _runtime_count(conn_id: str, entity_path: str) -> dict[str, Any]:
    """The entity's ``dead_letter_message_count``; the emulator's unanswered endpoint falls back to a peek."""
    entity = parse_entity(entity_path)
    config = await ServiceBusSharedStreamHook(conn_id).aget_client_config()
    try:
        async with config.make_admin_client(retry_total=0) as admin:
            if entity.queue_name is not None:
                properties = await admin.get_queue_runtime_properties(entity.queue_name)
            else:
                properties = await admin.get_subscription_runtime_properties(
                    entity.topic_name, entity.subscription_name
                )
    except (ServiceRequestError, ServiceResponseError):
        if not config.development_emulator:
            raise
        return await _peek_count(config, entity)
    except HttpResponseError as refused:
        if refused.status_code not in REFUSED_STATUSES:
            raise
        return await _peek_count(config, entity)  # a connection that may listen but not manage
    return {"depth": int(properties.dead_letter_message_count or 0), "at_least": False}


async def _peek_count(config: ServiceBusClientConfig, entity: Entity) -> dict[str, Any]:
    """Count the ``$deadletterqueue`` by peeking it, up to :data:`PEEK_LIMIT` (the emulator's way)."""
    async with config.make_client(retry_total=0) as client:
        if entity.queue_name is not None:
            receiver = client.get_queue_receiver(entity.queue_name, sub_queue=ServiceBusSubQueue.DEAD_LETTER)
        else:
            receiver = client.get_subscription_receiver(
                entity.topic_name, entity.subscription_name, sub_queue=ServiceBusSubQueue.DEAD_LETTER
            )
        async with receiver:
            count, next_sequence = 0, 0
            while count < PEEK_LIMIT:
                want = min(PEEK_BATCH, PEEK_LIMIT - count)
                batch = await receiver.peek_messages(max_message_count=want, sequence_number=next_sequence)
                if not batch:
                    break
                count += len(batch)
                next_sequence = max(m.sequence_number or 0 for m in batch) + 1
    return {"depth": count, "at_least": count >= PEEK_LIMIT}


class ServiceBusOperations(BrokerOperations):
    trigger = ServiceBusSharedStreamTrigger
    hook = ServiceBusSharedStreamHook
    redrive_needs_dead_letter = False
    own_dead_letter = "the entity's $deadletterqueue"

    def backlog(self, trigger_kwargs: Mapping[str, Any]) -> Backlog:
        conn_id = self.connection_or_default(trigger_kwargs)
        return {"dead_letter": dead_letter_depth(conn_id, entity_path(trigger_kwargs))}

    def redrive_ends(
        self, upstream: Mapping[str, Any], dead_letter: Any
    ) -> tuple[str | None, str | None] | None:
        """From the entity's own ``$deadletterqueue`` (``dead_letter`` empty) to the entity."""
        return entity_path(upstream), None

    def dead_letter_source(self, **kwargs: Any) -> DeadLetterSource:
        return dead_letter_source(**kwargs)


OPERATIONS = ServiceBusOperations()
