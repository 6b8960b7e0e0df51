"""
What only a Pub/Sub stream has, against Google's emulator: the message envelope, subscription
spellings, a failed watcher's message nacked at once, and where rejects go (the trigger's
dead-letter topic, the subscription's dead-letter policy, or nowhere: refused at start). The
behaviour every broker shares is in the contract (test_pubsub_contract.py).
"""

from __future__ import annotations

import asyncio
import base64
import json

import pytest

from airflow_shared_stream.common.reject_routes import RejectWithNowhereToGoError
from airflow_shared_stream.pubsub.trigger import PubSubSharedStreamTrigger
from airflow_shared_stream.testing import SharedStreamHarness
from tests.integration.pubsub.recording import RecordingTrigger, track
from tests.support.waiting import eventually

pytestmark = pytest.mark.integration


def ids_of(watcher) -> list[str]:
    return [p["message_id"] for p in watcher.payloads]


async def assert_nothing_comes_back(pubsub, subscription: str, ack_deadline: int = 10) -> None:
    """
    Everything was acknowledged: after the stream is gone and every lease has run out, a pull
    finds nothing. (Pub/Sub has no backlog API; an unacknowledged message reappears once its
    ack deadline passes, so waiting that long tells acknowledged from merely leased.)
    """
    await asyncio.sleep(ack_deadline + 1.5)
    left = await asyncio.to_thread(pubsub.pull, subscription, ack=False)
    assert [m.message.message_id for m in left] == []


async def test_payload_is_the_envelope(pubsub, harness):
    topic, subscription = pubsub.topic_with_subscription(ordering=True)
    watcher = harness.add(PubSubSharedStreamTrigger(subscription, match="attributes.tenant == 'acme'"))
    [json_id] = pubsub.publish(topic, [{"id": 1}], attributes={"tenant": "acme"}, ordering_key="k1")
    [text_id] = pubsub.publish(topic, ["plain text, not {json"], attributes={"tenant": "acme"})
    [binary_id] = pubsub.publish(topic, [b"\xff\xfe\x00binary"], attributes={"tenant": "acme"})
    pubsub.publish(topic, [{"id": 2}], attributes={"tenant": "other"})
    await watcher.wait_for_events(3)
    by_id = {p["message_id"]: p for p in watcher.payloads}
    assert set(by_id) == {json_id, text_id, binary_id}
    payload = by_id[json_id]
    assert set(payload) == {
        "message_id",
        "publish_time",
        "body",
        "attributes",
        "ordering_key",
        "delivery_attempt",
        "subscription",
    }
    assert payload["body"] == {"id": 1}
    assert payload["attributes"] == {"tenant": "acme"}
    assert payload["ordering_key"] == "k1"
    assert payload["delivery_attempt"] is None  # no dead-letter policy: Pub/Sub does not count
    assert payload["publish_time"].endswith("Z")
    assert payload["subscription"] == subscription
    assert by_id[text_id]["body"] == "plain text, not {json"
    assert by_id[text_id]["ordering_key"] is None
    assert by_id[binary_id]["body_encoding"] == "base64"
    assert base64.b64decode(by_id[binary_id]["body"]) == b"\xff\xfe\x00binary"
    assert "ack_id" not in json.dumps(watcher.payloads)


async def test_short_name_and_full_path_share_one_subscriber(pubsub, harness):
    topic, subscription = pubsub.topic_with_subscription()
    short = subscription.rsplit("/", 1)[1]
    by_short_name = harness.add(PubSubSharedStreamTrigger(short))  # project from the connection
    by_full_path = harness.add(PubSubSharedStreamTrigger(subscription, max_in_flight=500))
    by_project_id = harness.add(PubSubSharedStreamTrigger(short, project_id=pubsub.project))
    assert by_short_name.key == by_full_path.key == by_project_id.key
    sent = pubsub.publish(topic, [{"n": i} for i in range(20)])
    for watcher in (by_short_name, by_full_path, by_project_id):
        await watcher.wait_for_events(20)
        assert sorted(ids_of(watcher)) == sorted(sent)
    # One group: one subscriber; had there been two, Pub/Sub would have split the messages.
    assert len(harness.manager._groups) == 1


async def test_failed_watcher_makes_the_message_come_back_at_once(pubsub):
    topic, subscription = pubsub.topic_with_subscription(ack_deadline_seconds=60)
    async with SharedStreamHarness(confirm_after=None, ack_timeout=2.0) as harness:
        failing = harness.add(PubSubSharedStreamTrigger(subscription))
        healthy = harness.add(PubSubSharedStreamTrigger(subscription))
        [sent] = pubsub.publish(topic, [{"n": 1}])
        await healthy.wait_for_events(1)
        await failing.wait_for_events(1)
        harness.confirm(watcher=healthy)
        # The failing watcher's event is never persisted: the manager fails it after the ack
        # timeout, and the producer nacks the message (modify_ack_deadline 0), so it comes back
        # now rather than after its 60 s deadline.
        await failing.wait_for_error(timeout=20)
        await healthy.wait_for_events(2, timeout=20)
        assert ids_of(healthy) == [sent, sent]


async def test_a_reject_without_dead_letter_topic_goes_to_the_policy_topic_and_fires_no_watcher_again(
    pubsub, harness
):
    """
    One watcher accepts a message, another rejects it: it leaves the subscription once.

    Nacked to the subscription's dead-letter policy instead, Pub/Sub handed it out again until the
    policy moved it, and the watcher that accepted it fired on every delivery (five times with
    ``max_delivery_attempts=5``). The stream publishes it to the policy's topic itself, with the
    reason and origin, and acknowledges it.
    """
    dead_topic, dead_reader = pubsub.topic_with_subscription()
    topic = pubsub.create_topic()
    subscription = pubsub.create_subscription(topic, dead_letter_topic=dead_topic, max_delivery_attempts=5)
    ledger = track(subscription, ack_deadline=10)
    rejecting = harness.add(RecordingTrigger(subscription, reject="body.order_id == null"))
    accepting = harness.add(RecordingTrigger(subscription))
    sent = pubsub.publish(topic, [{"order_id": 1}, {"broken": True}, {"order_id": 2}])
    await rejecting.wait_for_events(2)
    dead = await eventually(
        lambda: pubsub.pull(dead_reader),
        lambda m: len(m) == 1,
        timeout=90,
        what="dead letter on the policy topic",
    )
    assert sorted(ids_of(accepting)) == sorted(sent)  # each once: the rejected one never came back
    assert json.loads(dead[0].message.data) == {"broken": True}
    attributes = dict(dead[0].message.attributes)
    assert attributes["dead_letter_reason"] == "rejected"
    assert attributes["dead_letter_origin_message_id"] == sent[1]
    await eventually(lambda: ledger.acked, lambda acked: acked == set(sent), timeout=30, what="acknowledged")
    await harness.stop()
    await assert_nothing_comes_back(pubsub, subscription)
    assert sorted(ids_of(accepting)) == sorted(sent)  # each once: the rejected one never came back
    assert [p["body"]["order_id"] for p in rejecting.payloads] == [1, 2]


async def test_a_reject_with_nowhere_to_dead_letter_is_refused_at_start(pubsub, harness):
    """
    No ``dead_letter_topic`` and no dead-letter policy: a watcher with ``reject`` does not run.

    Its rejects could only be given back, and every watcher that accepted them would fire again
    on each delivery. Started together with the other watchers, the stream fails before its first
    pull (nothing is taken from the subscription); joining a running stream, it fails alone.
    """
    topic, subscription = pubsub.topic_with_subscription()
    [first] = pubsub.publish(topic, [{"n": 1}])
    accepting = harness.add(PubSubSharedStreamTrigger(subscription))
    rejecting = harness.add(PubSubSharedStreamTrigger(subscription, reject="body.n == `1`"))
    error = await rejecting.wait_for_error()
    assert isinstance(error, RejectWithNowhereToGoError)
    assert f"trigger {rejecting.trigger_id}" in str(error)
    assert "dead-letter policy" in str(error)
    await accepting.wait_for_error()
    assert accepting.events == []
    # Never pulled: still there, not leased to the failed stream.
    left = await asyncio.to_thread(pubsub.pull, subscription, ack=False)
    assert [m.message.message_id for m in left] == [first]

    async with SharedStreamHarness(confirm_after=0.0) as second:
        accepting = second.add(PubSubSharedStreamTrigger(subscription))
        await accepting.wait_for_events(1, timeout=30)
        late = second.add(PubSubSharedStreamTrigger(subscription, reject="body.n == `2`"))
        error = await late.wait_for_error()
        assert isinstance(error, RejectWithNowhereToGoError)
        [then] = pubsub.publish(topic, [{"n": 2}])
        await accepting.wait_for_events(2)
        assert accepting.error is None
        assert ids_of(accepting) == [first, then]
        assert late.events == []


async def test_reject_with_dead_letter_topic_publishes_then_acknowledges(pubsub, harness):
    dead_topic, dead_reader = pubsub.topic_with_subscription()
    topic, subscription = pubsub.topic_with_subscription(ordering=True)
    ledger = track(subscription, ack_deadline=10)
    short_dead_topic = dead_topic.rsplit("/", 1)[1]
    good = harness.add(
        RecordingTrigger(subscription, reject="body.order_id == null", dead_letter_topic=short_dead_topic)
    )
    other = harness.add(
        RecordingTrigger(subscription, match="body.order_id > `1`", dead_letter_topic=dead_topic)
    )
    ids = pubsub.publish(
        topic,
        [{"order_id": 1}, {"broken": True}, {"order_id": 2}],
        attributes={"source": "shop"},
        ordering_key="c1",
    )
    await good.wait_for_events(2)
    await other.wait_for_events(1)
    dead = await eventually(
        lambda: pubsub.pull(dead_reader), lambda m: len(m) == 1, timeout=30, what="dead letter"
    )
    copy = dead[0].message
    assert json.loads(copy.data) == {"broken": True}
    assert copy.ordering_key == "c1"
    attributes = dict(copy.attributes)
    assert attributes["source"] == "shop"
    assert attributes["dead_letter_reason"] == "rejected"
    assert "reject expression" in attributes["dead_letter_description"]
    assert attributes["dead_letter_origin_subscription"] == subscription
    assert attributes["dead_letter_origin_message_id"] == ids[1]
    await eventually(lambda: ledger.acked, lambda acked: acked == set(ids), timeout=30, what="acknowledged")
    await harness.stop()
    await assert_nothing_comes_back(pubsub, subscription)
    # Acknowledged after the copy: the source never handed the rejected message out again.
    assert sorted(p["body"].get("order_id") for p in good.payloads) == [1, 2]
