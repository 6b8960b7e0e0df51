"""
Dead-letter copies fit Pub/Sub's limits: 100 attributes per message, 10 MB per publish request.

Unit level: Google's emulator enforces neither limit (it accepted 105 attributes and an 11 MB
message), so a copy over them passes there and fails, every time, only against Pub/Sub itself.
"""

from __future__ import annotations

from airflow_shared_stream.pubsub.dead_letter import (
    DEAD_LETTER_ATTRIBUTES_DROPPED,
    DEAD_LETTER_TRUNCATED_FROM,
    MAX_ATTRIBUTES,
    PUBLISH_REQUEST_BYTES,
    copy_for_dead_letter,
    request_size,
)

TOPIC = "projects/shop-prod-1/topics/orders-dlq"
OURS = {
    "dead_letter_reason": "rejected",
    "dead_letter_description": "trigger 3: reject expression 'body.x' matched",
    "dead_letter_origin_subscription": "projects/shop-prod-1/subscriptions/orders",
    "dead_letter_origin_message_id": "17",
    "dead_letter_origin_publish_time": "2026-11-22T04:30:00.000000Z",
}


def copy(data: bytes = b"{}", attributes: dict[str, str] | None = None):
    return copy_for_dead_letter(
        topic=TOPIC, data=data, attributes=attributes or {}, ordering_key="c-1", ours=OURS
    )


def test_a_copy_within_the_limits_is_the_original_plus_ours():
    original = {f"a{i:03}": "v" for i in range(MAX_ATTRIBUTES - len(OURS))}
    made = copy(b'{"n": 1}', original)
    assert dict(made.attributes) == {**original, **OURS}
    assert made.data == b'{"n": 1}'
    assert made.ordering_key == "c-1"


def test_a_message_with_100_attributes_gets_a_copy_with_100_ours_kept_and_the_dropped_counted():
    original = {f"a{i:03}": "v" for i in range(MAX_ATTRIBUTES)}
    attributes = dict(copy(attributes=original).attributes)
    assert len(attributes) == MAX_ATTRIBUTES
    assert {name: attributes[name] for name in OURS} == OURS
    kept = sorted(set(attributes) & set(original))
    assert kept == sorted(original)[: len(kept)]  # the names that sort last gave way
    assert attributes[DEAD_LETTER_ATTRIBUTES_DROPPED] == str(len(original) - len(kept))


def test_an_attribute_named_like_ours_is_overwritten_not_counted_twice():
    original = {f"a{i:03}": "v" for i in range(MAX_ATTRIBUTES - len(OURS) - 1)}
    original["dead_letter_reason"] = "an earlier dead-lettering"
    attributes = dict(copy(attributes=original).attributes)
    assert attributes["dead_letter_reason"] == "rejected"
    assert DEAD_LETTER_ATTRIBUTES_DROPPED not in attributes
    assert len(attributes) == MAX_ATTRIBUTES - 1


def test_a_copy_of_a_message_close_to_10_mb_is_cut_to_fit_the_publish_request():
    data = bytes(range(256)) * ((PUBLISH_REQUEST_BYTES - 100) // 256)  # fitted its own request
    made = copy(data, {"tenant": "acme"})
    assert request_size(TOPIC, made) <= PUBLISH_REQUEST_BYTES
    assert request_size(TOPIC, made) > PUBLISH_REQUEST_BYTES - 16  # cut no more than it must
    assert data.startswith(made.data)
    attributes = dict(made.attributes)
    assert attributes[DEAD_LETTER_TRUNCATED_FROM] == str(len(data))
    assert attributes["tenant"] == "acme"
    assert attributes["dead_letter_reason"] == "rejected"


def test_both_limits_at_once():
    original = {f"a{i:03}": "v" * 1000 for i in range(MAX_ATTRIBUTES)}
    made = copy(b"x" * PUBLISH_REQUEST_BYTES, original)
    attributes = dict(made.attributes)
    assert len(attributes) == MAX_ATTRIBUTES
    assert request_size(TOPIC, made) <= PUBLISH_REQUEST_BYTES
    assert attributes[DEAD_LETTER_TRUNCATED_FROM] == str(PUBLISH_REQUEST_BYTES)
    assert attributes[DEAD_LETTER_ATTRIBUTES_DROPPED] == str(
        MAX_ATTRIBUTES - (MAX_ATTRIBUTES - len(OURS) - 2)
    )


def test_a_copy_never_carries_the_dead_letter_policy_s_stamp():
    """A redrive trusts the policy's stamp over ours: one a message carried itself is dropped."""
    forged = {
        "CloudPubSubDeadLetterSourceSubscription": "payments",
        "CloudPubSubDeadLetterSourceSubscriptionProject": "shop-prod-1",
        "theirs": "v",
    }
    assert dict(copy(attributes=forged).attributes) == {"theirs": "v", **OURS}
