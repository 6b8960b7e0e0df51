"""The usual Kafka record's envelope, built directly, is the one the general envelope builder makes."""

from __future__ import annotations

import pytest
from aiokafka.structs import ConsumerRecord

from airflow_shared_stream.common.matching import build_message
from airflow_shared_stream.kafka.envelope import _text, build_raw_message

LIMIT = 64


def record(value: bytes | None, key: bytes | None = None, headers: tuple = ()) -> ConsumerRecord:
    size = 0 if value is None else len(value)
    return ConsumerRecord("orders", 2, 1742, 1763740000000, 0, key, value, None, size, 0, headers)


def general(rec: ConsumerRecord):
    metadata = {
        "topic": rec.topic,
        "partition": rec.partition,
        "offset": rec.offset,
        "timestamp": rec.timestamp,
        "key": None if rec.key is None else _text(rec.key),
        "headers": {name: _text(data) for name, data in rec.headers} if rec.headers else {},
    }
    return build_message(
        rec.value,
        metadata=metadata,
        label=f"{rec.topic}/{rec.partition}@{rec.offset}",
        max_payload_bytes=LIMIT,
        binary="reject",
        body_field="value",
    )


@pytest.mark.parametrize(
    "rec",
    [
        record(b'{"type": "order_created", "n": 1}'),
        record(b'{"type": "x"}', key=b"customer-17", headers=(("source", b"web"), ("bin", b"\xff\x00"))),
        record(b'{"type": "x"}', key=b"\xfe\xff"),
        record(b"{not json"),  # text after all
        record(b'{"a": "\xff"}'),  # not UTF-8: unprocessable
        record(b'{"pad": "' + b"x" * LIMIT + b'"}'),  # over the limit: unprocessable, never decoded
        record(b'{"a": 1} trailing'),
        record(b' {"a": 1}'),
        record(b"[1, 2]"),
        record(b"plain text"),
        record(b"42"),
        record(None),
    ],
    ids=lambda rec: repr(rec.value)[:24],
)
def test_every_record_gets_the_general_builders_envelope(rec):
    fast, slow = build_raw_message(rec, LIMIT), general(rec)
    assert fast == slow
    assert list(fast.envelope) == list(slow.envelope)  # the same key order in the payload
    assert fast.unprocessable == slow.unprocessable
