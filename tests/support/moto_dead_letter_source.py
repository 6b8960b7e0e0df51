"""
A patch of moto's SQS (test server only): messages SQS moves to a dead-letter queue carry
``DeadLetterQueueSourceArn``, as the service writes it.

Real SQS returns the system attribute ``DeadLetterQueueSourceArn`` (the ARN of the queue a
message was moved from by that queue's ``RedrivePolicy``) to a ``ReceiveMessage`` that asks for
it by name or with ``All`` (API reference, ReceiveMessage, ``MessageSystemAttributeNames``). No
sender can write it: ``SendMessage`` takes ``AWSTraceHeader`` as its only system attribute. moto
5.2.5 moves the message without writing it, nor does its main branch (a snapshot of 2026-08-22), so
a redrive tested on moto could only trust message attributes a sender may forge.

Here the move is recognised where it happens: moto hands the same ``Message`` object from the
source queue to the dead-letter queue's ``add_message``, so a message that arrives in a second
queue was moved, from the first. The receive answers with the source ARN as SQS does. Idempotent;
applied wherever :func:`~tests.support.moto_sqs.serialize_queue_mutations` is (it is what the
service does, so it is always on). A chain of dead-letter queues records the queue the message
was last moved from (not verified on the service).

On a move to a FIFO dead-letter queue SQS replaces the message's deduplication id with its
message id, "to make sure that the DLQ deduplication will not prevent storing of two independent
messages that happen to share a deduplication ID" (Developer Guide, "Configuring a dead-letter
queue redrive"); moto kept the original id, and its dead-letter queue dropped the second of two
queues' messages that shared one. The patch writes the message id, as SQS does.
"""

from __future__ import annotations

import functools
import threading
from typing import Any

DEAD_LETTER_QUEUE_SOURCE_ARN = "DeadLetterQueueSourceArn"
_PATCHED = "_airflow_shared_stream_dead_letter_source"
_HOME_QUEUE = "_airflow_shared_stream_home_queue_arn"
_MOVED_FROM = "_airflow_shared_stream_dead_letter_source_arn"


def record_dead_letter_source() -> None:
    """Make moto's SQS write and return ``DeadLetterQueueSourceArn`` (see the module)."""
    from moto.sqs.models import Queue, SQSBackend
    from moto.sqs.responses import SQSResponse

    if getattr(Queue.add_message, _PATCHED, False):
        return
    add_message = Queue.add_message
    backend_receive = SQSBackend.receive_message
    respond_receive = SQSResponse.receive_message
    received = threading.local()  # moto answers each request on a thread of its own

    @functools.wraps(add_message)
    def add_noting_the_source(queue: Any, message: Any) -> None:
        home = getattr(message, _HOME_QUEUE, None)
        if home is not None and home != queue.queue_arn:
            setattr(message, _MOVED_FROM, home)  # moto moves the message object itself
            if queue.fifo_queue:  # SQS: the deduplication id becomes the message id on the move
                message.deduplication_id = message.id
        setattr(message, _HOME_QUEUE, queue.queue_arn)
        add_message(queue, message)

    @functools.wraps(backend_receive)
    def receive_keeping_the_messages(backend: Any, *args: Any, **kwargs: Any) -> Any:
        messages = backend_receive(backend, *args, **kwargs)
        received.sources = {m.id: getattr(m, _MOVED_FROM, None) for m in messages}
        return messages

    @functools.wraps(respond_receive)
    def respond_with_the_source(response: Any) -> Any:
        received.sources = {}
        result = respond_receive(response)
        asked = set(response._get_param("AttributeNames", []))
        asked |= set(response._get_param("MessageSystemAttributeNames", []))
        if not asked & {"All", DEAD_LETTER_QUEUE_SOURCE_ARN}:
            return result
        for message in getattr(result, "result", {}).get("Messages", ()):
            source = received.sources.get(message["MessageId"])
            if source is not None:
                message.setdefault("Attributes", {})[DEAD_LETTER_QUEUE_SOURCE_ARN] = source
        return result

    setattr(add_noting_the_source, _PATCHED, True)
    Queue.add_message = add_noting_the_source  # type: ignore[method-assign,assignment]
    SQSBackend.receive_message = receive_keeping_the_messages  # type: ignore[method-assign,assignment]
    SQSResponse.receive_message = respond_with_the_source  # type: ignore[method-assign,assignment]
