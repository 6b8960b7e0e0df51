"""Trigger configuration, stream keys and the envelope built from a Kafka record."""

from __future__ import annotations

import json
from dataclasses import dataclass

import pytest
from airflow.exceptions import AirflowProviderDeprecationWarning

from airflow_shared_stream.common.errors import StreamShapeConflictError
from airflow_shared_stream.kafka.envelope import build_raw_message
from airflow_shared_stream.kafka.identity import GroupClaims, consumer_group_id
from airflow_shared_stream.kafka.producer import KafkaSharedStreamProducer
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
    trigger = KafkaSharedStreamTrigger(["b", "a", "b"], kafka_config_id="c", match="value.a == `1`")
    path, kwargs = trigger.serialize()
    assert path == "airflow_shared_stream.kafka.trigger.KafkaSharedStreamTrigger"
    assert set(kwargs) == {"topics", "kafka_config_id", "group_id", "dead_letter_topic", "max_in_flight",
                           "max_payload_bytes", "match", "reject"}  # fmt: skip
    assert kwargs["topics"] == ["a", "b"]
    rebuilt = KafkaSharedStreamTrigger(**json.loads(json.dumps(kwargs)))
    assert rebuilt.serialize() == trigger.serialize()
    assert rebuilt.shared_stream_key() == trigger.shared_stream_key()


def test_key_is_order_insensitive_and_ignores_match():
    a = KafkaSharedStreamTrigger(["x", "y"], match="value.a")
    b = KafkaSharedStreamTrigger(["y", "x"], reject="value.b")
    assert a.shared_stream_key() == b.shared_stream_key()
    assert hash(a.shared_stream_key()) == hash(b.shared_stream_key())


@pytest.mark.parametrize("other", [{"kafka_config_id": "other"}, {"group_id": "g2"}, {"topics": ["x"]}])
def test_key_is_the_upstream_identity(other):
    base = {"topics": ["x", "y"], "kafka_config_id": "c", "group_id": "g"}
    assert (
        KafkaSharedStreamTrigger(**base).shared_stream_key()
        != KafkaSharedStreamTrigger(**{**base, **other}).shared_stream_key()
    )


@pytest.mark.parametrize(
    "tuning", [{"dead_letter_topic": "dlq"}, {"max_in_flight": 10}, {"max_payload_bytes": 100}]
)
def test_tuning_never_splits_the_stream(tuning):
    """tuning arguments are not part of the stream's identity."""
    base = {"topics": ["y", "x", "x"], "kafka_config_id": "c"}
    assert (
        KafkaSharedStreamTrigger(**base).shared_stream_key()
        == KafkaSharedStreamTrigger(**{**base, **tuning}).shared_stream_key()
    )


def test_derived_group_depends_on_topics_and_connection_only():
    group = consumer_group_id(["b", "a"], "c", group_id=None, connection_group_id=None)
    assert group == consumer_group_id(["a", "b", "a"], "c", group_id=None, connection_group_id=None)
    assert group.startswith("airflow-shared-stream-")
    assert group != consumer_group_id(["a"], "c", group_id=None, connection_group_id=None)
    assert group != consumer_group_id(["a", "b"], "d", group_id=None, connection_group_id=None)
    assert consumer_group_id(["a"], "c", group_id="mine", connection_group_id="team") == "mine"


def test_connection_group_id_is_a_prefix_never_a_shared_group():
    """two streams on one connection with a group.id get two groups."""
    one = consumer_group_id(["a"], "c", group_id=None, connection_group_id="team")
    two = consumer_group_id(["a", "b"], "c", group_id=None, connection_group_id="team")
    assert one.startswith("team-")
    assert two.startswith("team-")
    assert one != two


def test_group_claims_refuse_a_second_stream_in_one_group():
    claims = GroupClaims()
    claims.claim("g", (("a",), "c"))
    claims.claim("g", (("a",), "c"))  # the same stream again (another harness, a restart)
    with pytest.raises(ValueError, match="'g' is already used by another stream"):
        claims.claim("g", (("a", "b"), "c"))
    claims.release("g", (("a",), "c"))
    claims.release("g", (("a",), "c"))
    claims.claim("g", (("a", "b"), "c"))


def test_a_watcher_disagreeing_on_tuning_is_refused_naming_the_argument():
    first = KafkaSharedStreamTrigger(["x"], max_in_flight=100)
    second = KafkaSharedStreamTrigger(["x"], max_in_flight=200)
    with pytest.raises(StreamShapeConflictError, match=r"max_in_flight=200"):
        KafkaSharedStreamTrigger.check_shape_agrees(first.normalized_shape(), second.normalized_shape())


def test_old_spellings_still_work_with_a_warning_naming_the_new_one():
    with pytest.warns(AirflowProviderDeprecationWarning, match=r"kafka_config_id=\.\.\."):
        positional = KafkaSharedStreamTrigger(["x"], "conn", "grp")
    assert (positional.kafka_config_id, positional.group_id) == ("conn", "grp")
    with pytest.warns(AirflowProviderDeprecationWarning, match=r"use kafka_config_id=\.\.\. instead"):
        renamed = KafkaSharedStreamTrigger(["x"], kafka_conn_id="conn")
    assert renamed.kafka_config_id == "conn"
    assert (
        renamed.shared_stream_key()
        == KafkaSharedStreamTrigger(["x"], kafka_config_id="conn").shared_stream_key()
    )
    assert "kafka_conn_id" not in renamed.serialize()[1]


def test_producer_from_kwargs_resolves_the_group_on_connect():
    trigger = KafkaSharedStreamTrigger(["x"], kafka_config_id="c")
    producer = KafkaSharedStreamTrigger.create_shared_stream_producer(trigger.serialize()[1])
    assert isinstance(producer, KafkaSharedStreamProducer)
    assert producer.requested_group_id is None
    explicit = KafkaSharedStreamTrigger(["x"], group_id="mine")
    assert KafkaSharedStreamTrigger.create_shared_stream_producer(explicit.serialize()[1]).group_id == "mine"


def test_get_advance_lane_is_topic_partition():
    producer = KafkaSharedStreamTrigger.create_shared_stream_producer(
        KafkaSharedStreamTrigger(["x"]).serialize()[1]
    )
    from airflow_shared_stream.kafka.envelope import KafkaBrokerPayload

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
    assert big.unprocessable == "body of 2000 bytes exceeds the 1000-byte payload limit (max_payload_bytes)"
    assert big.envelope["value"] is None
    binary = build_raw_message(Record(value=b"\xff\xfe"), max_payload_bytes=1000)
    assert binary.unprocessable is not None
    assert "UTF-8" in binary.unprocessable
