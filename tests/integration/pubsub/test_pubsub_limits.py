"""
Pub/Sub's size limits on what the stream reads, against Google's emulator.

gRPC refuses a response over a channel's receive limit (4 MiB unless the channel says otherwise),
and Pub/Sub hands out up to 1,000 messages of up to 10 MB in one pull: every channel of the stream
must take a response as large as Pub/Sub sends, or a backlog of large messages fails every pull.
"""

from __future__ import annotations

import json

import pytest

from tests.integration.pubsub.recording import RecordingTrigger, track
from tests.support.waiting import eventually

pytestmark = pytest.mark.integration


async def test_a_backlog_whose_pull_is_over_grpcs_default_receive_limit_is_read(pubsub, harness):
    """
    120 messages of 48 KB (each under ``max_payload_bytes``): a pull of 100 of them is 4.8 MB.

    On a channel built with gRPC's defaults every such pull failed with ResourceExhausted
    ("Received message larger than max"), the stream failed and, restarted, failed again: no
    event, ever. The emulator channel now takes the options Google's transports give the
    production channel (no receive limit).
    """
    topic, subscription = pubsub.topic_with_subscription()
    ledger = track(subscription, ack_deadline=10)
    sent = pubsub.publish(topic, [{"n": i, "pad": "x" * 48_000} for i in range(120)])
    watcher = harness.add(RecordingTrigger(subscription))
    await watcher.wait_for_events(120, timeout=60)
    assert sorted(p["message_id"] for p in watcher.payloads) == sorted(sent)
    await eventually(lambda: ledger.acked, lambda acked: acked == set(sent), timeout=30, what="acknowledged")


async def test_dead_letter_copies_of_messages_at_pubsubs_limits_are_fitted_and_settled(pubsub, harness):
    """
    A rejected message with 100 attributes, and one of close to 10 MB (too large for an event).

    Their copies, with our five attributes added, would be over Pub/Sub's 100 attributes and its
    10 MB publish request, refused every time: a crash loop. The emulator enforces neither limit
    (the unit tests check the fitting), so this checks the fitted copies end to end: ours kept,
    what gave way counted, the originals acknowledged.
    """
    dead_topic, dead_reader = pubsub.topic_with_subscription()
    topic, subscription = pubsub.topic_with_subscription()
    ledger = track(subscription, ack_deadline=10)
    harness.add(
        RecordingTrigger(subscription, reject="attributes.kind == 'bad'", dead_letter_topic=dead_topic)
    )
    many = {f"a{i:03}": "v" for i in range(99)} | {"kind": "bad"}
    [with_many] = pubsub.publish(topic, [{"n": 1}], attributes=many)
    [large] = pubsub.publish(topic, [b"x" * (10_000_000 - 200)])
    dead = await eventually(
        lambda: pubsub.pull(dead_reader, max_messages=1),
        lambda m: len(m) == 1,
        timeout=60,
        what="dead letter",
    )
    dead += await eventually(
        lambda: pubsub.pull(dead_reader, max_messages=1),
        lambda m: len(m) == 1,
        timeout=60,
        what="dead letter",
    )
    by_origin = {m.message.attributes["dead_letter_origin_message_id"]: m.message for m in dead}
    attributes = dict(by_origin[with_many].attributes)
    assert len(attributes) == 100
    assert attributes["dead_letter_reason"] == "rejected"
    assert attributes["dead_letter_attributes_dropped"] == "6"
    assert json.loads(by_origin[with_many].data) == {"n": 1}
    attributes = dict(by_origin[large].attributes)
    assert attributes["dead_letter_reason"] == "unprocessable"
    assert attributes["dead_letter_truncated_from"] == str(10_000_000 - 200)
    assert by_origin[large].data == b"x" * len(by_origin[large].data)
    await eventually(
        lambda: ledger.acked, lambda acked: acked == {with_many, large}, timeout=30, what="acknowledged"
    )
