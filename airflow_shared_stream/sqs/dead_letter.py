"""
The dead-letter copy of an SQS message, made to fit the dead-letter queue.

The copy is the original's body and message attributes plus where it came from
(``dead_letter_origin_queue``: the source queue's ARN, what a redrive sends it home by) and why
(two attributes), as far as SQS's limit of ten attributes leaves room: the origin first. A copy
larger than the dead-letter queue's ``MaximumMessageSize`` would be refused every time and loop
on the source queue, so its body is cut on a UTF-8 boundary and ``dead_letter_truncated_from``
carries the original size.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from airflow_shared_stream.common.delivery import DeadLetter
from airflow_shared_stream.sqs.hook import QueueUrl

log = logging.getLogger(__name__)


@dataclass(slots=True)
class SqsMessageHandle:
    """What the settlement calls, and the dead-letter copy, need of one received message."""

    message_id: str
    receipt_handle: str
    body: str
    message_attributes: dict[str, Any]
    group_id: str | None


SQS_BATCH_LIMIT = 10
"""Most entries SQS accepts in one receive, delete, visibility or send batch call."""

SQS_MAX_MESSAGE_BYTES = 262_144
"""SQS's historical message and batch size limit; the DLQ's own MaximumMessageSize is used when known."""

SQS_MAX_MESSAGE_ATTRIBUTES = 10
"""Most message attributes SQS accepts on one message."""

DEAD_LETTER_REASON = "dead_letter_reason"
DEAD_LETTER_DESCRIPTION = "dead_letter_description"
DEAD_LETTER_TRUNCATED_FROM = "dead_letter_truncated_from"
DEAD_LETTER_ORIGIN_QUEUE = "dead_letter_origin_queue"
"""The ARN of the queue a dead letter came from: a redrive moves it to that queue only."""
_DESCRIPTION_LIMIT = 1024
_TRUNCATION_MARGIN = 512


def dead_letter_entry(
    index: int,
    letter: DeadLetter[SqsMessageHandle],
    *,
    queue: QueueUrl | None,
    max_bytes: int,
    origin: str | None = None,
) -> dict[str, Any]:
    """
    The ``SendMessageBatch`` entry for one letter to ``queue``: body, original attributes, the
    origin (``origin``: the source queue's ARN) and the reason.
    """
    handle = letter.delivery.handle
    attributes = sendable_attributes(handle.message_attributes)
    # Only our dead-lettering writes these on a copy: an origin the message carries itself (its
    # sender wrote it, or a copy kept it) would route a redrive into whatever queue it names, and
    # a truncation marker would keep the whole message from going home.
    attributes.pop(DEAD_LETTER_ORIGIN_QUEUE, None)
    for marker in (DEAD_LETTER_TRUNCATED_FROM, DEAD_LETTER_REASON, DEAD_LETTER_DESCRIPTION):
        attributes.pop(marker, None)
    if origin and len(attributes) < SQS_MAX_MESSAGE_ATTRIBUTES:
        attributes[DEAD_LETTER_ORIGIN_QUEUE] = {"DataType": "String", "StringValue": origin}
    reason = {
        DEAD_LETTER_REASON: {"DataType": "String", "StringValue": letter.reason},
        DEAD_LETTER_DESCRIPTION: {
            "DataType": "String",
            "StringValue": letter.description[:_DESCRIPTION_LIMIT] or "-",
        },
    }
    if len(attributes) + len(reason) + 1 <= SQS_MAX_MESSAGE_ATTRIBUTES:
        attributes.update(reason)
    entry: dict[str, Any] = {"Id": str(index), "MessageBody": handle.body}
    if attributes:
        entry["MessageAttributes"] = attributes
    if entry_size(entry) > max_bytes:
        entry = _truncated(entry, max_bytes, queue)
    if queue is not None and queue.is_fifo:
        entry["MessageGroupId"] = handle.group_id or handle.message_id
        entry["MessageDeduplicationId"] = handle.message_id
    return entry


def entry_size(entry: dict[str, Any]) -> int:
    """Bytes SQS counts for a send entry: the body plus every attribute's name, type and value."""
    return len(entry["MessageBody"].encode("utf-8")) + _attributes_size(entry.get("MessageAttributes", {}))


def _truncated(entry: dict[str, Any], limit: int, queue: QueueUrl | None) -> dict[str, Any]:
    """An entry cut to fit the dead-letter queue: truncated body, original size recorded."""
    body: str = entry["MessageBody"]
    original = len(body.encode("utf-8"))
    attributes = dict(entry.get("MessageAttributes", {}))
    marker = {DEAD_LETTER_TRUNCATED_FROM: {"DataType": "Number", "StringValue": str(original)}}
    if len(attributes) >= SQS_MAX_MESSAGE_ATTRIBUTES:
        ours = (DEAD_LETTER_ORIGIN_QUEUE, DEAD_LETTER_REASON, DEAD_LETTER_DESCRIPTION)
        attributes = {k: v for k, v in attributes.items() if k in ours}
    attributes.update(marker)
    room = limit - _attributes_size(attributes) - _TRUNCATION_MARGIN
    if room < 0:  # the original attributes alone are too large: keep only ours
        attributes = {k: v for k, v in attributes.items() if k.startswith("dead_letter_")}
        room = limit - _attributes_size(attributes) - _TRUNCATION_MARGIN
    cut = body.encode("utf-8")[: max(0, room)].decode("utf-8", errors="ignore")
    log.warning(
        "Message of %d bytes is too large for dead-letter queue %s (%d bytes): "
        "dead-lettering its first %d bytes",
        original,
        queue.url if queue else "?",
        limit,
        len(cut.encode("utf-8")),
    )
    return {**entry, "MessageBody": cut or "-", "MessageAttributes": attributes}


def _attributes_size(attributes: dict[str, Any]) -> int:
    size = 0
    for name, attribute in attributes.items():
        size += len(name.encode("utf-8")) + len(attribute.get("DataType", "").encode("utf-8"))
        if "StringValue" in attribute:
            size += len(attribute["StringValue"].encode("utf-8"))
        if "BinaryValue" in attribute:
            size += len(attribute["BinaryValue"])
    return size


def sendable_attributes(attributes: dict[str, Any]) -> dict[str, Any]:
    """Received message attributes in the shape SendMessage accepts (no empty list fields)."""
    return {
        name: {k: v for k, v in attribute.items() if k in ("DataType", "StringValue", "BinaryValue")}
        for name, attribute in attributes.items()
    }
