"""The Pub/Sub shared stream against Google's Pub/Sub emulator, through Airflow's real manager."""

from __future__ import annotations

import asyncio
import base64
import collections
import json
import random

import pytest

from airflow_shared_stream.common.errors import StreamShapeConflictError
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


async def test_three_watchers_with_different_matches_share_one_subscriber(pubsub, harness):
    topic, subscription = pubsub.topic_with_subscription()
    ledger = track(subscription, ack_deadline=10)
    kinds = ["order", "refund", "ping"]
    watchers = {
        kind: harness.add(RecordingTrigger(subscription, match=f"body.kind == '{kind}'")) for kind in kinds
    }
    bodies = [{"kind": kinds[i % 3], "n": i} for i in range(30)]
    sent = pubsub.publish(topic, bodies)

    for watcher in watchers.values():
        await watcher.wait_for_events(10)
    assert len(harness.manager._groups) == 1
    for kind, watcher in watchers.items():
        expected = [mid for mid, body in zip(sent, bodies, strict=True) if body["kind"] == kind]
        assert sorted(ids_of(watcher)) == sorted(expected)
        assert {p["subscription"] for p in watcher.payloads} == {subscription}
    await eventually(lambda: ledger.acked, lambda acked: acked == set(sent), timeout=30, what="acknowledged")
    await harness.stop()
    await assert_nothing_comes_back(pubsub, subscription)


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


async def test_ack_only_after_persistence_and_no_redelivery_while_outstanding(pubsub):
    """An event outstanding for twice the ack deadline is not redelivered: its lease is extended."""
    topic, subscription = pubsub.topic_with_subscription(ack_deadline_seconds=10)
    ledger = track(subscription, ack_deadline=10)
    async with SharedStreamHarness(confirm_after=None) as harness:
        watcher = harness.add(RecordingTrigger(subscription))
        sent = pubsub.publish(topic, [{"n": i} for i in range(5)])
        await watcher.wait_for_events(5)
        await asyncio.sleep(22)  # more than two ack deadlines with nothing persisted
        # Nothing acknowledged, nothing redelivered: still the same five events, once each.
        assert sorted(ids_of(watcher)) == sorted(sent)
        probe = await asyncio.to_thread(pubsub.pull, subscription, ack=False)
        assert probe == []  # still leased to the stream, not back on the subscription
        assert ledger.acked == set()
        assert harness.confirm() == 5
        await eventually(
            lambda: ledger.acked, lambda acked: acked == set(sent), timeout=30, what="acknowledged"
        )
    await assert_nothing_comes_back(pubsub, subscription)
    assert sorted(ids_of(watcher)) == sorted(sent)


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


async def test_oversized_data_is_dead_lettered_not_fired(pubsub, harness):
    dead_topic, dead_reader = pubsub.topic_with_subscription()
    topic, subscription = pubsub.topic_with_subscription()
    watcher = harness.add(PubSubSharedStreamTrigger(subscription, dead_letter_topic=dead_topic))
    pubsub.publish(topic, [{"blob": "x" * 70_000}, {"small": True}])
    await watcher.wait_for_events(1)
    dead = await eventually(
        lambda: pubsub.pull(dead_reader), lambda m: len(m) == 1, timeout=30, what="dead letter"
    )
    assert len(dead[0].message.data) > 70_000
    assert dict(dead[0].message.attributes)["dead_letter_reason"] == "unprocessable"
    assert [p["body"] for p in watcher.payloads] == [{"small": True}]


async def test_ordering_keys_keep_their_order_through_uneven_persistence(pubsub):
    topic, subscription = pubsub.topic_with_subscription(ordering=True)
    rng = random.Random(7)
    async with SharedStreamHarness(confirm_after=lambda: rng.uniform(0.0, 0.3)) as harness:
        first = harness.add(PubSubSharedStreamTrigger(subscription))
        second = harness.add(PubSubSharedStreamTrigger(subscription, match="body.seq >= `0`"))
        for key in ("a", "b", "c"):
            pubsub.publish(topic, [{"key": key, "seq": i} for i in range(15)], ordering_key=key)
        for watcher in (first, second):
            await watcher.wait_for_events(45)
            per_key = collections.defaultdict(list)
            for payload in watcher.payloads:
                assert payload["ordering_key"] == payload["body"]["key"]
                per_key[payload["ordering_key"]].append(payload["body"]["seq"])
            assert per_key == {key: list(range(15)) for key in ("a", "b", "c")}


async def test_a_watcher_with_another_dead_letter_topic_fails_naming_it(pubsub, harness):
    topic, subscription = pubsub.topic_with_subscription()
    dead_topic = pubsub.create_topic()
    first = harness.add(PubSubSharedStreamTrigger(subscription, dead_letter_topic=dead_topic))
    second = harness.add(PubSubSharedStreamTrigger(subscription))
    error = await second.wait_for_error()
    assert isinstance(error, StreamShapeConflictError)
    assert "dead_letter_topic=None" in str(error)
    [sent] = pubsub.publish(topic, [{"n": 1}])
    await first.wait_for_events(1)
    assert ids_of(first) == [sent]


async def test_closing_the_stream_gives_unsettled_messages_back_at_once(pubsub):
    """A stream that closes (last watcher gone, triggerer stopping) nacks what it still holds."""
    topic, subscription = pubsub.topic_with_subscription(ack_deadline_seconds=60)
    trigger = PubSubSharedStreamTrigger(subscription)
    producer = type(trigger).create_shared_stream_producer(trigger.serialize()[1])
    [sent] = pubsub.publish(topic, [{"n": 1}])
    events = producer.open_stream()
    raw, _ = await asyncio.wait_for(anext(events), timeout=30)
    assert raw.envelope["message_id"] == sent
    await events.aclose()
    await producer.aclose()
    # Not after its 60 s deadline: now.
    again = await eventually(
        lambda: pubsub.pull(subscription, ack=False),
        lambda m: len(m) == 1,
        timeout=10,
        what="the nacked message",
    )
    assert again[0].message.message_id == sent


async def test_closing_the_stream_sends_queued_acks_and_does_not_nack_them(pubsub):
    """
    An ACK the batcher still holds when the stream closes is sent, never undone by the close.

    The manager advanced the first message (persisted: done) while the second was still in
    flight, so its ACK waits in the batcher for others to fill a batch. Closing must acknowledge
    it and give back only the second; a close that nacks every held lease first would hand the
    finished message back to Pub/Sub, to be fired again by the next stream.
    """
    from airflow.triggers.shared_stream import AdvanceItem, AdvanceOutcome

    topic, subscription = pubsub.topic_with_subscription(ack_deadline_seconds=60)
    ledger = track(subscription, ack_deadline=60)
    trigger = RecordingTrigger(subscription)
    producer = type(trigger).create_shared_stream_producer(trigger.serialize()[1])
    nacked: list[str] = []
    original_nack = producer.redeliver

    async def recording_nack(deliveries):
        nacked.extend(d.handle.message_id for d in deliveries)
        await original_nack(deliveries)

    producer.redeliver = recording_nack
    sent = pubsub.publish(topic, [{"n": 1}, {"n": 2}])
    events = producer.open_stream()
    received = [await asyncio.wait_for(anext(events), timeout=30) for _ in range(2)]
    (_, done_payload), _still_open = sorted(received, key=lambda r: sent.index(r[0].envelope["message_id"]))
    await producer.advance([AdvanceItem(done_payload, AdvanceOutcome(acked=1, failed=0, rejected=0))])
    assert len(producer._acks) == 1  # queued: the other message is still in flight
    await events.aclose()
    await producer.aclose()

    assert ledger.acked == {sent[0]}
    # Given back while the stream's pulls were still in flight, the second message may come back
    # to one of them at once; the close gives that copy back too. The finished one never.
    assert set(nacked) == {sent[1]}
    again = await eventually(
        lambda: pubsub.pull(subscription, ack=False),
        lambda m: len(m) >= 1,
        timeout=10,
        what="the unsettled message given back",
    )
    assert [m.message.message_id for m in again] == [sent[1]]
