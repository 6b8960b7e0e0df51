"""
What only an SQS stream has, against moto's server: the message envelope (attributes, no receipt
handle), the dead-letter queue from the redrive policy or the trigger, and a reject with no
dead-letter queue left on the queue. The behaviour every broker shares is in the contract
(test_sqs_contract.py).
"""

from __future__ import annotations

import asyncio
import json
import logging

import pytest

from airflow_shared_stream.sqs.trigger import SqsSharedStreamTrigger
from tests.integration.sqs.conftest import SECRET_KEY
from tests.support.waiting import eventually

pytestmark = pytest.mark.integration

EMPTY = (0, 0)


def ids_of(watcher) -> list[str]:
    return [p["message_id"] for p in watcher.payloads]


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
