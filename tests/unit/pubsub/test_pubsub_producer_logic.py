"""The producer's pure parts: envelope, lanes, dead-letter attributes (no broker involved)."""

from __future__ import annotations

import datetime
from typing import Any

import pytest
from google.protobuf import timestamp_pb2
from google.pubsub_v1 import PubsubMessage, ReceivedMessage

from airflow_shared_stream.common.leased_queue import DeadLetter
from airflow_shared_stream.pubsub.dead_letter import truncate_utf8
from airflow_shared_stream.pubsub.producer import PubSubSharedStreamProducer

SUBSCRIPTION = "projects/shop-prod-1/subscriptions/orders"


def producer(*, ordered: bool, max_payload_bytes: int = 65536) -> PubSubSharedStreamProducer:
    p = PubSubSharedStreamProducer(
        subscription=SUBSCRIPTION,
        project_id=None,
        gcp_conn_id="google_cloud_default",
        dead_letter_topic="orders-dlq",
        max_in_flight=10,
        max_payload_bytes=max_payload_bytes,
    )
    p.subscription = SUBSCRIPTION  # what connect() resolves
    p._ordered = ordered
    return p


def received(data: bytes, *, key: str = "", attempt: int = 0, ack_id: str = "ack-1", nanos: int = 0) -> Any:
    """A pulled message as :meth:`PubSubClient.pull` returns it: the raw protobuf."""
    when = timestamp_pb2.Timestamp()
    when.FromDatetime(datetime.datetime(2026, 11, 22, 4, 30, tzinfo=datetime.timezone.utc))
    when.nanos = nanos
    return ReceivedMessage.pb(
        ReceivedMessage(
            ack_id=ack_id,
            delivery_attempt=attempt,
            message=PubsubMessage(
                data=data, attributes={"tier": "vip"}, message_id="m-1", publish_time=when, ordering_key=key
            ),
        )
    )


def test_envelope_fields_and_no_ack_id():
    delivery = producer(ordered=False)._delivery(received(b'{"order_id": "o-1"}', attempt=3))
    assert delivery.message.envelope == {
        "body": {"order_id": "o-1"},
        "message_id": "m-1",
        "publish_time": "2026-11-22T04:30:00.000000Z",
        "attributes": {"tier": "vip"},
        "ordering_key": None,
        "delivery_attempt": 3,
        "subscription": SUBSCRIPTION,
    }
    assert delivery.lease == "ack-1"
    assert "ack-1" not in str(delivery.message.envelope)


@pytest.mark.parametrize(
    ("nanos", "written"),
    [
        (0, "2026-11-22T04:30:00.000000Z"),
        (123456000, "2026-11-22T04:30:00.123456Z"),
        (123456789, "2026-11-22T04:30:00.123456789Z"),
        (5000000, "2026-11-22T04:30:00.005Z"),
    ],
)
def test_publish_time_is_written_as_the_sdk_writes_it(nanos: int, written: str):
    raw = received(b"{}", nanos=nanos)
    assert producer(ordered=False)._delivery(raw).message.envelope["publish_time"] == written
    # The same text google-cloud-pubsub's proto-plus DatetimeWithNanoseconds gives.
    assert ReceivedMessage.wrap(raw).message.publish_time.rfc3339() == written


def test_ordering_key_is_a_lane_only_on_an_ordered_subscription():
    assert producer(ordered=True)._delivery(received(b"x", key="c-17")).lane == "c-17"
    assert producer(ordered=True)._delivery(received(b"x")).lane is None
    assert producer(ordered=False)._delivery(received(b"x", key="c-17")).lane is None


def test_oversized_data_is_unprocessable():
    delivery = producer(ordered=False, max_payload_bytes=10)._delivery(received(b"x" * 11))
    assert delivery.message.unprocessable is not None
    assert delivery.message.envelope["body"] is None


def test_dead_letter_copy_keeps_attributes_and_adds_reason_and_origin():
    p = producer(ordered=True)
    delivery = p._delivery(received(b"{}", key="c-17"))
    copy = p._dead_letter_copy(DeadLetter(delivery, "rejected", "trigger 3: " + "é" * 2000))
    assert copy.ordering_key == "c-17"
    attributes = dict(copy.attributes)
    assert attributes["tier"] == "vip"
    assert attributes["dead_letter_reason"] == "rejected"
    assert len(attributes["dead_letter_description"].encode()) <= 1024
    assert attributes["dead_letter_origin_subscription"] == SUBSCRIPTION
    assert attributes["dead_letter_origin_message_id"] == "m-1"
    assert attributes["dead_letter_origin_publish_time"] == "2026-11-22T04:30:00.000000Z"


def test_truncate_keeps_utf8_whole():
    assert truncate_utf8("abc", 10) == "abc"
    cut = truncate_utf8("é" * 10, 9)
    assert cut.endswith("...")
    assert len(cut.encode()) <= 9
