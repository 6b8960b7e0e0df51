"""
Regression tests for issue 7's SQS items, against moto's SQS server, through Airflow's manager.

Each failed on the code before the fix (run on commit 8cb14b2 and seen failing):

* item 4: the stream key was the raw (queue_url, aws_conn_id, region_name);
* item 5: dead-letter batches ignored the byte limits; the error named the source queue;
* item 10: no backoff when nobody is subscribed; one lock across renewals and settlements;
* item 11: a redelivered FIFO message did not hold back the later ones of its group.
"""

from __future__ import annotations

import asyncio
import json
import time

import pytest
from airflow.triggers.shared_stream import AdvanceItem, AdvanceOutcome

from airflow_shared_stream.sqs.producer import SqsSharedStreamProducer
from airflow_shared_stream.sqs.trigger import SqsSharedStreamTrigger
from airflow_shared_stream.testing import SharedStreamHarness
from tests.support.waiting import eventually

pytestmark = pytest.mark.integration

EMPTY = (0, 0)


def ids_of(watcher) -> list[str]:
    return [p["message_id"] for p in watcher.payloads]


# -- item 4: one queue, one stream -------------------------------------------------------------


async def test_a_region_left_to_the_connection_and_one_spelled_out_share_one_receiver(
    sqs, aws_connection, harness
):
    url = sqs.create_queue()
    implicit = harness.add(SqsSharedStreamTrigger(url))
    explicit = harness.add(SqsSharedStreamTrigger(url, region_name=sqs.region))
    sent = sqs.send(url, [{"n": i} for i in range(30)])
    # Two receivers competing for one queue would each see part of it and delete the rest.
    await implicit.wait_for_events(30, timeout=30)
    await explicit.wait_for_events(30, timeout=30)
    assert sorted(ids_of(implicit)) == sorted(ids_of(explicit)) == sorted(sent)
    assert implicit.key == explicit.key


async def test_a_watcher_on_another_connection_fails_loudly_naming_aws_conn_id(
    sqs, aws_connection, harness, monkeypatch
):
    monkeypatch.setenv("AIRFLOW_CONN_AWS_OTHER", json.dumps(sqs.connection()))
    url = sqs.create_queue()
    first = harness.add(SqsSharedStreamTrigger(url))
    other = harness.add(SqsSharedStreamTrigger(url, aws_conn_id="aws_other"))
    error = await other.wait_for_error(timeout=15)
    assert "aws_conn_id='aws_other'" in str(error)
    sent = sqs.send(url, [{"n": 1}])
    await first.wait_for_events(1)
    assert ids_of(first) == sent


# -- item 5: dead-letter sizes ----------------------------------------------------------------


async def test_dead_letter_batches_are_split_by_bytes(sqs, aws_connection, harness):
    dlq = sqs.create_queue()
    url = sqs.create_queue(visibility_timeout=60)
    # Five 300 KB messages received together: one SendMessageBatch would carry 1.5 MB.
    for i in range(5):
        sqs.client.send_message(QueueUrl=url, MessageBody=json.dumps({"n": i, "blob": "x" * 300_000}))
    watcher = harness.add(SqsSharedStreamTrigger(url, dead_letter_queue_url=dlq))
    await eventually(lambda: sqs.depth(url), lambda d: d == EMPTY, timeout=30, what="source drained")
    dead = await eventually(lambda: sqs.drain(dlq), lambda m: len(m) == 5, timeout=15, what="5 dead letters")
    assert sorted(json.loads(m["Body"])["n"] for m in dead) == list(range(5))
    assert watcher.error is None


async def test_a_message_too_large_for_the_dead_letter_queue_still_leaves_the_stream(
    sqs, aws_connection, harness
):
    dlq = sqs.create_queue(MaximumMessageSize="2048")
    url = sqs.create_queue(visibility_timeout=2)
    body = json.dumps({"bad": True, "blob": "é" * 4000})
    sqs.client.send_message(QueueUrl=url, MessageBody=body)
    watcher = harness.add(SqsSharedStreamTrigger(url, dead_letter_queue_url=dlq, reject="body.bad"))
    await eventually(lambda: sqs.depth(url), lambda d: d == EMPTY, timeout=20, what="source drained")
    [dead] = await eventually(lambda: sqs.drain(dlq), lambda m: len(m) == 1, timeout=15, what="dead letter")
    attributes = dead["MessageAttributes"]
    assert attributes["dead_letter_truncated_from"]["StringValue"] == str(len(body.encode("utf-8")))
    assert attributes["dead_letter_reason"]["StringValue"] == "rejected"
    assert "body.bad" in attributes["dead_letter_description"]["StringValue"]
    assert body.startswith(dead["Body"])
    assert watcher.error is None


async def test_a_dead_letter_queue_that_does_not_exist_is_named_in_the_error(sqs, aws_connection, harness):
    dlq = sqs.create_queue()
    sqs.client.delete_queue(QueueUrl=dlq)
    url = sqs.create_queue()
    watcher = harness.add(SqsSharedStreamTrigger(url, dead_letter_queue_url=dlq, reject="body.bad"))
    sqs.send(url, [{"bad": True}])
    error = await watcher.wait_for_error(timeout=20)
    assert dlq in str(error)
    assert url not in str(error)


# -- item 10: liveness ------------------------------------------------------------------------


async def test_nobody_subscribed_backs_off_instead_of_spinning_on_the_queue(sqs, aws_connection):
    url = sqs.create_queue(visibility_timeout=300)
    sqs.send(url, [{"n": 1}])
    producer = SqsSharedStreamProducer(
        queue_url=url,
        aws_conn_id=aws_connection,
        region_name=None,
        dead_letter_queue_url=None,
        max_in_flight=10,
    )
    stream = producer.open_stream()
    receives = 0
    try:
        deadline = time.monotonic() + 3.0
        while time.monotonic() < deadline:
            _, payload = await asyncio.wait_for(anext(stream), timeout=10)
            receives += 1
            await producer.advance([AdvanceItem(payload, AdvanceOutcome(acked=0, failed=0, rejected=0))])
    finally:
        await stream.aclose()
        await producer.aclose()
    # 0.25 + 0.5 + 1 s of backoff leave room for four offers in three seconds (the next would
    # come after 2 s more). Regression: a receive read ahead before the advance that found nobody
    # subscribed skipped the backoff and brought the message straight back; under the full
    # suite's load that made 7 in 3 s. (The message is now held and offered again, not received.)
    assert 2 <= receives <= 5, f"offered the unsubscribed message {receives} times in 3 s"


async def test_a_slow_dead_letter_send_does_not_let_other_leases_lapse(sqs, aws_connection, monkeypatch):
    dlq = sqs.create_queue()
    url = sqs.create_queue(visibility_timeout=2)
    original_call = SqsSharedStreamProducer._call

    async def slow_dead_letter_send(self, operation, *args, **kwargs):
        if operation == "SendMessageBatch":
            await asyncio.sleep(6)  # a DLQ answering slowly, or retries under throttling
        return await original_call(self, operation, *args, **kwargs)

    monkeypatch.setattr(SqsSharedStreamProducer, "_call", slow_dead_letter_send)
    async with SharedStreamHarness(confirm_after=None) as harness:
        watcher = harness.add(SqsSharedStreamTrigger(url, dead_letter_queue_url=dlq, reject="body.bad"))
        held = sqs.send(url, [{"n": i} for i in range(3)])
        await watcher.wait_for_events(3)
        sqs.send(url, [{"bad": True}])
        await eventually(lambda: sqs.drain(dlq), lambda m: len(m) == 1, timeout=30, what="dead letter")
        harness.confirm()
        await eventually(lambda: sqs.depth(url), lambda d: d == EMPTY, timeout=30, what="source drained")
    # Held for 6 s, three times their visibility timeout, while the dead-letter send ran.
    assert ids_of(watcher) == held
    assert {p["attributes"]["ApproximateReceiveCount"] for p in watcher.payloads} == {"1"}


# -- item 11: FIFO order after a redelivery ---------------------------------------------------


async def test_a_redelivered_fifo_message_holds_back_the_later_ones_of_its_group(sqs, aws_connection):
    url = sqs.create_queue(fifo=True, visibility_timeout=30)
    sqs.send(
        url,
        [{"seq": 1}, {"seq": 2}],
        MessageGroupId="g",
        MessageDeduplicationId=lambda i: f"dedup-{i}",
    )
    async with SharedStreamHarness(confirm_after=None, ack_timeout=2.0) as harness:
        # Short polls: moto only sees a FIFO group unlock when a poll starts.
        slow = harness.add(SqsSharedStreamTrigger(url, match="body.seq == `1`", wait_time_seconds=1))
        fast = harness.add(SqsSharedStreamTrigger(url, wait_time_seconds=1))
        await fast.wait_for_events(2)
        await slow.wait_for_events(1)
        harness.confirm(watcher=fast)  # seq 2 persisted for everyone; seq 1 never for `slow`
        await slow.wait_for_error(timeout=10)  # AckTimeout: seq 1 must come back
        retried = harness.add(SqsSharedStreamTrigger(url, match="body.seq == `1`", wait_time_seconds=1))
        await retried.wait_for_events(1, timeout=20)
        for _ in range(40):
            harness.confirm()
            if sqs.depth(url) == EMPTY and len(fast.payloads) >= 4:
                break
            await asyncio.sleep(0.25)
    order = [p["body"]["seq"] for p in fast.payloads]
    # Seq 2 was acked, but deleting it while seq 1 came back would hand the group out of order.
    assert order == [1, 2, 1, 2], order
