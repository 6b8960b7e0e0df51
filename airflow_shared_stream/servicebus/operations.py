"""
What the Streams page, redrive and the ``shared+servicebus`` scheme ask of Service Bus.

:class:`~airflow_shared_stream.common.operations.BrokerOperations`, in Service Bus's words.

The dead-letter depth counts the entity's ``$deadletterqueue`` by peeking it (a peek neither
locks nor counts as a delivery), at most :data:`PEEK_LIMIT` messages. The management API's
``dead_letter_message_count`` would be one call, but it is a separate HTTPS/ATOM endpoint that a
connection string to an AMQP-only endpoint (an emulator, a test server) does not answer. A
redrive reads the entity's own ``$deadletterqueue``: a stream names no dead-letter destination.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from azure.servicebus import ServiceBusSubQueue

from airflow_shared_stream.common.operations import Backlog, BrokerOperations, DepthRead
from airflow_shared_stream.common.redrive import DeadLetterSource
from airflow_shared_stream.servicebus.hook import ServiceBusSharedStreamHook
from airflow_shared_stream.servicebus.redrive import dead_letter_source, parse_entity
from airflow_shared_stream.servicebus.trigger import ServiceBusSharedStreamTrigger

PEEK_LIMIT = 1000
"""A Service Bus dead-letter sub-queue is counted up to this many (shown as "1000+")."""
PEEK_BATCH = 250


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
        lambda: _peek_count(conn_id, entity_path),
    )


async def _peek_count(conn_id: str, entity_path: str) -> dict[str, Any]:
    entity = parse_entity(entity_path)
    config = await ServiceBusSharedStreamHook(conn_id).aget_client_config()
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
