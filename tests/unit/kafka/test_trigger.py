"""Trigger configuration, stream keys and the envelope built from a Kafka record."""

from __future__ import annotations

import json
from dataclasses import dataclass

import pytest

from airflow_shared_stream.kafka.producer import (
    KafkaSharedStreamProducer,
    build_raw_message,
    default_group_id,
)
from airflow_shared_stream.kafka.trigger import KafkaSharedStreamTrigger


@dataclass
class Record:
    topic: str = "t"
    partition: int = 2
    offset: int = 41
    timestamp: int = 1_700_000_000_000
    key: bytes | None = b"k1"
    value: bytes | None = b'{"a": 1}'
    headers: tuple = (("h", b"v"), ("raw", b"\xff"))


def test_serialize_round_trips_and_holds_no_secret():
    trigger = KafkaSharedStreamTrigger(["b", "a", "b"], kafka_conn_id="c", match="value.a == `1`")
    path, kwargs = trigger.serialize()
    assert path == "airflow_shared_stream.kafka.trigger.KafkaSharedStreamTrigger"
    assert kwargs["topics"] == ["a", "b"]
    rebuilt = KafkaSharedStreamTrigger(**json.loads(json.dumps(kwargs)))
    assert rebuilt.serialize() == trigger.serialize()
    assert rebuilt.shared_stream_key() == trigger.shared_stream_key()


def test_key_is_order_insensitive_and_ignores_match():
    a = KafkaSharedStreamTrigger(["x", "y"], match="value.a")
    b = KafkaSharedStreamTrigger(["y", "x"], reject="value.b")
    assert a.shared_stream_key() == b.shared_stream_key()
    assert hash(a.shared_stream_key()) == hash(b.shared_stream_key())


@pytest.mark.parametrize(
    "other",
    [
        {"kafka_conn_id": "other"},
        {"group_id": "g2"},
        {"topics": ["x"]},
        {"dead_letter_topic": "dlq"},
        {"max_in_flight": 10},
    ],
)
def test_key_differs_when_producer_shape_differs(other):
    base = {"topics": ["x", "y"], "kafka_conn_id": "c", "group_id": "g"}
    assert (
        KafkaSharedStreamTrigger(**base).shared_stream_key()
        != KafkaSharedStreamTrigger(**{**base, **other}).shared_stream_key()
    )


def test_producer_from_kwargs_derives_deterministic_group():
    trigger = KafkaSharedStreamTrigger(["x"], kafka_conn_id="c")
    producer = KafkaSharedStreamTrigger.create_shared_stream_producer(trigger.serialize()[1])
    assert isinstance(producer, KafkaSharedStreamProducer)
    assert producer.group_id == default_group_id(trigger.shared_stream_key())
    again = KafkaSharedStreamTrigger.create_shared_stream_producer(trigger.serialize()[1])
    assert again.group_id == producer.group_id
    assert producer.group_id.startswith("airflow-shared-stream-")
    explicit = KafkaSharedStreamTrigger(["x"], group_id="mine")
    assert KafkaSharedStreamTrigger.create_shared_stream_producer(explicit.serialize()[1]).group_id == "mine"


def test_get_advance_lane_is_topic_partition():
    producer = KafkaSharedStreamTrigger.create_shared_stream_producer(
        KafkaSharedStreamTrigger(["x"]).serialize()[1]
    )
    from airflow_shared_stream.kafka.producer import KafkaBrokerPayload

    assert producer.get_advance_lane(KafkaBrokerPayload("x", 3, 9, 0)) == ("x", 3)


@pytest.mark.parametrize("bad", [[], "", [1], [""]])
def test_bad_topics_refused(bad):
    with pytest.raises(ValueError, match="topics"):
        KafkaSharedStreamTrigger(bad)


def test_envelope():
    message = build_raw_message(Record(), max_payload_bytes=1024)
    assert message.unprocessable is None
    assert message.label == "t/2@41"
    assert message.envelope == {
        "topic": "t",
        "partition": 2,
        "offset": 41,
        "timestamp": 1_700_000_000_000,
        "key": "k1",
        "value": {"a": 1},
        "headers": {"h": "v", "raw": "base64:/w=="},
    }
    json.dumps(message.envelope)


def test_envelope_text_and_null_values():
    assert build_raw_message(Record(value=b"plain text", key=None), 1024).envelope["value"] == "plain text"
    tombstone = build_raw_message(Record(value=None, headers=()), 1024)
    assert tombstone.envelope["value"] is None
    assert tombstone.unprocessable is None


def test_oversized_and_undecodable_values_are_unprocessable():
    big = build_raw_message(Record(value=b"x" * 2000), max_payload_bytes=1000)
    assert big.unprocessable == "value is 2000 bytes, over the 1000-byte payload limit"
    assert big.envelope["value"] is None
    binary = build_raw_message(Record(value=b"\xff\xfe"), max_payload_bytes=1000)
    assert binary.unprocessable is not None
    assert "UTF-8" in binary.unprocessable
