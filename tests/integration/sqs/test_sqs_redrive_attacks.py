"""
SQS redrive, attacked after issue 45 (FAULT_MODEL classes 1 and 15), against moto's server.

Each test is a break found by an attacker who did not write the change; each is marked
``xfail(strict=True)`` until it is fixed (the fixer removes the mark).
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from airflow_shared_stream.common.redrive import redrive
from airflow_shared_stream.sqs.trigger import SqsSharedStreamTrigger
from tests.integration.sqs.test_sqs_redrive_routes import source, stream_queue
from tests.support.brokers import SqsServer
from tests.support.waiting import eventually

pytestmark = pytest.mark.integration


async def test_a_message_that_names_its_own_origin_is_never_redriven_into_another_queue(
    sqs: SqsServer, aws_connection: str, harness: Any
) -> None:
    """
    FAULT_MODEL 1 and 15 (the origin's identity; routed home). Whoever may send to stream A's
    queue sends a message with ten attributes, one of them ``dead_letter_origin_queue`` naming
    stream B's queue. A rejects it into the dead-letter queue both streams share; with ten
    attributes of its own there is no room for our stamp, so the forged one stays, and stream B's
    redrive moves A's message into B's queue (docs: a message without room for the stamp "is
    left").
    """
    dlq = sqs.create_queue()
    queue_a, queue_b = stream_queue(sqs), stream_queue(sqs)
    forged = {"dead_letter_origin_queue": {"DataType": "String", "StringValue": sqs.arn(queue_b)}}
    theirs = {f"a{i}": {"DataType": "String", "StringValue": str(i)} for i in range(9)}
    harness.add(
        SqsSharedStreamTrigger(queue_a, reject="body.bad", dead_letter_queue_url=dlq, wait_time_seconds=1)
    )
    sqs.send(queue_a, [json.dumps({"n": 1, "bad": True})], MessageAttributes={**theirs, **forged})
    await eventually(lambda: sqs.depth(dlq), lambda d: d == (1, 0), timeout=30, what="dead-lettered")
    await harness.stop()

    summary = await redrive(source(aws_connection, dlq, queue_b))  # stream B's redrive

    assert sqs.depth(queue_b) == (0, 0)  # A's message never reaches B's queue
    assert (summary.moved, summary.left_untouched) == (0, 1)


@pytest.mark.xfail(
    strict=True,
    reason="a message SQS moved by its RedrivePolicy keeps a dead_letter_origin_queue its sender "
    "wrote, which the redrive takes for ours (SQS's own DeadLetterQueueSourceArn is not read; moto "
    "does not write it: a fix needs the service's attribute in the test server too)",
)
async def test_a_message_sqs_moved_itself_goes_by_sqs_s_origin_not_the_one_it_names(
    sqs: SqsServer, aws_connection: str
) -> None:
    """
    FAULT_MODEL 1, 15 and 16. Queues A and B share a dead-letter queue through their
    ``RedrivePolicy``. A message sent to A names B's ARN in ``dead_letter_origin_queue``; nobody
    settles it, so after ``maxReceiveCount`` SQS moves it to the dead-letter queue as it is (our
    dead-lettering never saw it, so nothing dropped the forged stamp). Stream B's redrive moves
    it into B's queue. SQS documents the system attribute ``DeadLetterQueueSourceArn`` on what
    it moved (ReceiveMessage, MessageSystemAttributeNames): the origin SQS wrote, which no
    sender can forge.
    """
    dlq = sqs.create_queue()
    queue_a = sqs.create_queue(visibility_timeout=1, dead_letter_queue_url=dlq, max_receives=1)
    queue_b = sqs.create_queue(visibility_timeout=1, dead_letter_queue_url=dlq, max_receives=1)
    forged = {"dead_letter_origin_queue": {"DataType": "String", "StringValue": sqs.arn(queue_b)}}
    sqs.send(queue_a, [json.dumps({"n": 1})], MessageAttributes=forged)

    def receive_until_moved() -> tuple[int, int]:
        sqs.client.receive_message(QueueUrl=queue_a, VisibilityTimeout=0, WaitTimeSeconds=0)
        return tuple(sqs.depth(dlq))

    await eventually(receive_until_moved, lambda d: d[0] == 1, timeout=30, what="moved by SQS")

    summary = await redrive(source(aws_connection, dlq, queue_b))  # stream B's redrive

    assert sqs.depth(queue_b) == (0, 0)  # A's message never reaches B's queue
    assert (summary.moved, summary.left_untouched) == (0, 1)
