"""The SQS shared stream against a real SQS API (moto's server), through Airflow's real manager."""

from __future__ import annotations

import asyncio
import collections
import json
import logging

import pytest
from airflow.triggers.shared_stream import AdvanceItem, AdvanceOutcome

from airflow_shared_stream.sqs.producer import SqsSharedStreamProducer
from airflow_shared_stream.sqs.trigger import SqsSharedStreamTrigger
from airflow_shared_stream.testing import SharedStreamHarness
from tests.integration.sqs.conftest import SECRET_KEY
from tests.support.waiting import eventually

pytestmark = pytest.mark.integration

EMPTY = (0, 0)


def ids_of(watcher) -> list[str]:
    return [p["message_id"] for p in watcher.payloads]


async def test_three_triggers_with_different_matches_share_one_poller(sqs, aws_connection, harness):
    url = sqs.create_queue()
    kinds = ["order", "refund", "ping"]
    watchers = {
        kind: harness.add(SqsSharedStreamTrigger(url, match=f"body.kind == '{kind}'")) for kind in kinds
    }
    bodies = [{"kind": kinds[i % 3], "n": i} for i in range(30)]
    sent = sqs.send(url, bodies)

    for watcher in watchers.values():
        await watcher.wait_for_events(10)
    await eventually(lambda: sqs.depth(url), lambda d: d == EMPTY, timeout=30, what="queue drained")

    # One group, so one producer and one receive loop for all three watchers.
    assert len(harness.manager._groups) == 1
    for kind, watcher in watchers.items():
        expected = [mid for mid, body in zip(sent, bodies, strict=True) if body["kind"] == kind]
        assert sorted(ids_of(watcher)) == sorted(expected)
        # Nobody else received these messages: each was handed out by SQS exactly once.
        assert {p["attributes"]["ApproximateReceiveCount"] for p in watcher.payloads} == {"1"}
        assert all(p["queue_url"] == url for p in watcher.payloads)


async def test_payload_is_the_envelope_without_receipt_handle_or_secrets(sqs, aws_connection, harness):
    url = sqs.create_queue()
    watcher = harness.add(SqsSharedStreamTrigger(url, match="message_attributes.tenant == 'acme'"))
    sqs.send(
        url,
        [{"id": 1}, "plain text body"],
        MessageAttributes={
            "tenant": {"DataType": "String", "StringValue": "acme"},
            "priority": {"DataType": "Number", "StringValue": "7"},
        },
    )
    await watcher.wait_for_events(2)
    bodies = sorted((p["body"] for p in watcher.payloads), key=json.dumps)
    assert bodies == ["plain text body", {"id": 1}]
    payload = watcher.payloads[0]
    assert set(payload) == {"message_id", "body", "attributes", "message_attributes", "queue_url"}
    assert payload["message_attributes"] == {"tenant": "acme", "priority": 7}
    text = json.dumps(watcher.payloads)
    assert "ReceiptHandle" not in text
    assert SECRET_KEY not in text


async def test_delete_happens_only_after_persistence_is_confirmed(sqs, aws_connection):
    url = sqs.create_queue()
    async with SharedStreamHarness(confirm_after=None) as harness:
        watcher = harness.add(SqsSharedStreamTrigger(url))
        sqs.send(url, [{"n": i} for i in range(5)])
        await watcher.wait_for_events(5)
        await asyncio.sleep(1.0)
        # Received and turned into trigger events, but not persisted: nothing may be deleted.
        assert sqs.depth(url) == (0, 5)
        assert harness.confirm() == 5
        await eventually(lambda: sqs.depth(url), lambda d: d == EMPTY, timeout=15, what="deletes")


@pytest.mark.parametrize("dlq_from", ["redrive_policy", "trigger_argument"])
async def test_reject_lands_on_the_dead_letter_queue(sqs, aws_connection, harness, dlq_from):
    dlq = sqs.create_queue()
    if dlq_from == "redrive_policy":
        policy = json.dumps({"deadLetterTargetArn": sqs.arn(dlq), "maxReceiveCount": "5"})
        url = sqs.create_queue(RedrivePolicy=policy)
        trigger_kwargs = {}
    else:
        url = sqs.create_queue()
        trigger_kwargs = {"dead_letter_queue_url": dlq}
    good = harness.add(SqsSharedStreamTrigger(url, reject="body.order_id == null", **trigger_kwargs))
    other = harness.add(SqsSharedStreamTrigger(url, match="body.order_id > `1`", **trigger_kwargs))
    sqs.send(
        url,
        [{"order_id": 1}, {"broken": True}, {"order_id": 2}],
        MessageAttributes={"source": {"DataType": "String", "StringValue": "shop"}},
    )
    await good.wait_for_events(2)
    await other.wait_for_events(1)
    await eventually(lambda: sqs.depth(url), lambda d: d == EMPTY, timeout=15, what="source drained")
    dead = await eventually(lambda: sqs.drain(dlq), lambda m: len(m) == 1, timeout=15, what="dead letter")
    assert json.loads(dead[0]["Body"]) == {"broken": True}
    assert dead[0]["MessageAttributes"]["source"]["StringValue"] == "shop"


async def test_oversized_body_is_dead_lettered_not_fired(sqs, aws_connection, harness):
    dlq = sqs.create_queue()
    url = sqs.create_queue()
    watcher = harness.add(SqsSharedStreamTrigger(url, dead_letter_queue_url=dlq))
    sqs.send(url, [{"blob": "x" * 70_000}, {"small": True}])
    await watcher.wait_for_events(1)
    dead = await eventually(lambda: sqs.drain(dlq), lambda m: len(m) == 1, timeout=15, what="dead letter")
    assert len(dead[0]["Body"]) > 70_000
    assert len(watcher.payloads) == 1
    assert watcher.payloads[0]["body"] == {"small": True}


async def test_reject_without_any_dead_letter_queue_leaves_the_message(sqs, aws_connection, harness, caplog):
    url = sqs.create_queue(visibility_timeout=30)
    watcher = harness.add(SqsSharedStreamTrigger(url, reject="body.bad"))
    with caplog.at_level(logging.WARNING):
        sqs.send(url, [{"bad": True}, {"bad": False}])
        await watcher.wait_for_events(1)
        # Wait until the rejected message was settled (left to the queue), not for a depth that
        # a deleted message would also show on its way out...
        await eventually(lambda: caplog.text, lambda t: "left to the queue" in t, timeout=15, what="settled")
        await eventually(lambda: sqs.depth(url), lambda d: d == (0, 1), timeout=15, what="good one deleted")
        # ...then insist it stays, over several samples.
        for _ in range(5):
            assert sqs.depth(url) == (0, 1), "the rejected message was deleted without a dead-letter queue"
            await asyncio.sleep(0.3)
    assert "no dead-letter queue" in caplog.text


async def test_ack_timeout_redelivers_to_the_failed_subscriber(sqs, aws_connection):
    url = sqs.create_queue()
    async with SharedStreamHarness(confirm_after=None, ack_timeout=2.0) as harness:
        slow = harness.add(SqsSharedStreamTrigger(url, match="body.n == `1`"))
        fast = harness.add(SqsSharedStreamTrigger(url))
        [message_id] = sqs.send(url, [{"n": 1}])
        await slow.wait_for_events(1)
        await fast.wait_for_events(1)
        harness.confirm(watcher=fast)  # slow's trigger event is never confirmed persisted
        error = await slow.wait_for_error(timeout=10)
        assert type(error).__name__ == "AckTimeout"
        # The triggerer restarts a failed watcher; the message must come back for it.
        retried = harness.add(SqsSharedStreamTrigger(url, match="body.n == `1`"))
        await retried.wait_for_events(1)
        assert ids_of(retried) == [message_id]
        assert retried.payloads[0]["attributes"]["ApproximateReceiveCount"] == "2"
        harness.confirm()
        await fast.wait_for_events(2)
        harness.confirm()
        await eventually(lambda: sqs.depth(url), lambda d: d == EMPTY, timeout=15, what="deleted")
        # At-least-once: the subscriber that had acked sees it again, but only once more.
        assert ids_of(fast) == [message_id, message_id]


async def test_message_fanned_out_with_no_subscriber_is_offered_again_without_a_receive(sqs, aws_connection):
    """An all-zero outcome (nobody online at fan-out): held and offered again, not received again."""
    url = sqs.create_queue(visibility_timeout=300)
    [message_id] = sqs.send(url, [{"n": 1}])
    producer = SqsSharedStreamProducer(
        queue_url=url,
        aws_conn_id=aws_connection,
        region_name=None,
        dead_letter_queue_url=None,
        max_in_flight=10,
    )
    stream = producer.open_stream()
    try:
        raw, handle = await anext(stream)
        assert raw.envelope["message_id"] == message_id
        await producer.advance([AdvanceItem(handle, AdvanceOutcome(acked=0, failed=0, rejected=0))])
        raw, _ = await asyncio.wait_for(anext(stream), timeout=10)
        assert raw.envelope["message_id"] == message_id
        assert raw.envelope["attributes"]["ApproximateReceiveCount"] == "1"  # no receive counted
    finally:
        await stream.aclose()
        await producer.aclose()


async def test_restart_mid_stream_loses_nothing(sqs, aws_connection):
    url = sqs.create_queue(visibility_timeout=2)
    sent = sqs.send(url, [{"n": i} for i in range(60)])
    seen: collections.Counter[str] = collections.Counter()
    async with SharedStreamHarness(confirm_after=0.5) as first:
        watcher = first.add(SqsSharedStreamTrigger(url, max_in_flight=20))
        await watcher.wait_for_events(25)
        seen.update(ids_of(watcher))
        # Leaving the block stops the triggerer with events still awaiting persistence.
    async with SharedStreamHarness(confirm_after=0.2) as second:
        watcher = second.add(SqsSharedStreamTrigger(url, max_in_flight=20))
        await eventually(
            lambda: set(seen) | set(ids_of(watcher)), lambda s: s == set(sent), timeout=60, what="every id"
        )
        await eventually(lambda: sqs.depth(url), lambda d: d == EMPTY, timeout=30, what="drained")
        seen.update(ids_of(watcher))
    assert set(seen) == set(sent)


async def test_lease_is_extended_while_the_event_awaits_persistence(sqs, aws_connection):
    url = sqs.create_queue(visibility_timeout=2)
    async with SharedStreamHarness(confirm_after=7.0) as harness:
        watcher = harness.add(SqsSharedStreamTrigger(url))
        sent = sqs.send(url, [{"n": i} for i in range(5)])
        await watcher.wait_for_events(5)
        # Held 3x past the queue's visibility timeout, then confirmed and deleted.
        await eventually(lambda: sqs.depth(url), lambda d: d == EMPTY, timeout=20, what="deleted")
        await asyncio.sleep(2.5)
    assert sorted(ids_of(watcher)) == sorted(sent)  # never redelivered while outstanding
    assert {p["attributes"]["ApproximateReceiveCount"] for p in watcher.payloads} == {"1"}


async def test_fifo_queue_keeps_order_per_message_group(sqs, aws_connection, harness):
    url = sqs.create_queue(fifo=True)
    groups = ["a", "b", "c"]
    bodies = [{"group": groups[i % 3], "seq": i} for i in range(30)]
    sqs.send(
        url,
        bodies,
        MessageGroupId=lambda i: groups[i % 3],
        MessageDeduplicationId=lambda i: f"dedup-{i}",
    )
    # moto snapshots a FIFO queue's locked groups when a long poll starts and does not see them
    # unlock until it ends (real SQS does); short polls keep this test quick.
    watcher = harness.add(SqsSharedStreamTrigger(url, wait_time_seconds=1))
    await watcher.wait_for_events(30)
    for group in groups:
        seqs = [p["body"]["seq"] for p in watcher.payloads if p["attributes"]["MessageGroupId"] == group]
        assert len(seqs) == 10
        assert seqs == sorted(seqs)
    await eventually(lambda: sqs.depth(url), lambda d: d == EMPTY, timeout=15, what="drained")


async def test_a_thousand_messages_through_ten_subscribers_with_late_confirmation(sqs, aws_connection):
    """Late persistence (1 s) and small subscriber queues: the credit window must prevent overflow."""
    url = sqs.create_queue()
    sent = sqs.send(url, [{"n": i} for i in range(1000)])
    async with SharedStreamHarness(confirm_after=1.0, max_subscriber_queue=128) as harness:
        watchers = [harness.add(SqsSharedStreamTrigger(url, max_in_flight=100)) for _ in range(10)]
        for watcher in watchers:
            await watcher.wait_for_events(1000, timeout=240)
        await eventually(lambda: sqs.depth(url), lambda d: d == EMPTY, timeout=60, what="drained")
    for watcher in watchers:
        assert watcher.error is None
        assert sorted(ids_of(watcher)) == sorted(sent)
