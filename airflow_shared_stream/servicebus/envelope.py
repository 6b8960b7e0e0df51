"""The envelope of a Service Bus message: its body, and the broker half every watcher matches on."""

from __future__ import annotations

import base64
import datetime
import json
import uuid
from typing import Any

from airflow_shared_stream.servicebus.hook import Entity


def jsonable(value: Any) -> Any:
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
        return {str(jsonable(k)): jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [jsonable(v) for v in value]
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
    return json.dumps(jsonable(value if raw.body_type == AmqpMessageBodyType.VALUE else list(value)))


def envelope_metadata(message: Any, entity: Entity, namespace: str) -> dict[str, Any]:
    """The broker half of the envelope every watcher matches on (JSON-able, secret-free)."""
    return {
        "message_id": jsonable(message.message_id),
        "sequence_number": message.sequence_number,
        "enqueued_time": jsonable(message.enqueued_time_utc),
        "delivery_count": message.delivery_count,
        "application_properties": jsonable(dict(message.application_properties or {})),
        "content_type": jsonable(message.content_type),
        "correlation_id": jsonable(message.correlation_id),
        "subject": jsonable(message.subject),
        "session_id": jsonable(message.session_id),
        "entity": entity.path,
        "namespace": namespace,
    }
