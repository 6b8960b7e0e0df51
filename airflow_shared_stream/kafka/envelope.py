"""
What a Kafka record becomes in the stream: the envelope watchers match, the payload that settles it.

The envelope is the trigger event's payload; :class:`KafkaBrokerPayload` is what
:meth:`~airflow_shared_stream.kafka.producer.KafkaSharedStreamProducer.advance` gets back to
commit, seek or dead-letter the record.
"""

from __future__ import annotations

import base64
import json
from typing import Any, NamedTuple

from airflow_shared_stream.common.matching import RawMessage, build_message

__all__ = ["KafkaBrokerPayload", "build_raw_message"]


class KafkaBrokerPayload(NamedTuple):
    """
    What the producer needs to settle one record (a named tuple: one is built per record).

    ``key``, ``value`` and ``headers`` are kept only with a dead-letter topic, to re-produce the
    record there.
    """

    topic: str
    partition: int
    offset: int
    seq: int = 0
    """Yield sequence number: which watchers surely received it (see :mod:`.watchers`)."""
    key: bytes | None = None
    value: bytes | None = None
    headers: tuple[tuple[str, bytes], ...] = ()


def _text(data: bytes | None) -> str | None:
    """Header values and keys as text where they are UTF-8, else base64 (still JSON-able)."""
    if data is None:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return "base64:" + base64.b64encode(data).decode("ascii")


def build_raw_message(record: Any, max_payload_bytes: int) -> RawMessage:
    """
    Turn one aiokafka ``ConsumerRecord`` into the envelope every subscriber matches against.

    A value that is not UTF-8 is unprocessable (dead-lettered with its bytes intact) rather than
    base64-encoded into the payload: Kafka values are often binary formats (Avro, Protobuf) that
    a JMESPath ``match`` cannot read anyway. The usual record, a JSON object within the payload
    limit, is built here directly: the envelope :func:`build_message` makes, without its checks
    for the other cases.
    """
    key = record.key
    headers = record.headers
    value = record.value
    if value is not None and len(value) <= max_payload_bytes and value[:1] == b"{":
        try:
            body = json.loads(value.decode("utf-8"))
        except ValueError:  # not UTF-8 (UnicodeDecodeError is one) or not JSON: the general path
            pass
        else:
            return RawMessage(
                {
                    "value": body,
                    "topic": record.topic,
                    "partition": record.partition,
                    "offset": record.offset,
                    "timestamp": record.timestamp,
                    "key": None if key is None else _text(key),
                    "headers": {name: _text(data) for name, data in headers} if headers else {},
                },
                f"{record.topic}/{record.partition}@{record.offset}",
            )
    metadata = {
        "topic": record.topic,
        "partition": record.partition,
        "offset": record.offset,
        "timestamp": record.timestamp,
        "key": None if key is None else _text(key),  # most records have none: no call for them
        "headers": {name: _text(data) for name, data in headers} if headers else {},
    }
    return build_message(
        value,
        metadata=metadata,
        label=f"{record.topic}/{record.partition}@{record.offset}",
        max_payload_bytes=max_payload_bytes,
        binary="reject",
        body_field="value",
    )
