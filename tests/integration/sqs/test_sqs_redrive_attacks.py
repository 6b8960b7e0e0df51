"""
SQS redrive, attacked after issue 45 (FAULT_MODEL classes 1 and 15), against moto's server.

Each test is a break found by an attacker who did not write the change, or by its fixer while
fixing one; a break not yet fixed is marked ``xfail(strict=True)``.
"""

from __future__ import annotations

import asyncio
import json
import logging
import uuid
from typing import Any

import pytest

from airflow_shared_stream.common.redrive import redrive
from airflow_shared_stream.sqs.trigger import SqsSharedStreamTrigger
from tests.integration.sqs.test_sqs_redrive_routes import collect, numbers, source, stream_queue
from tests.support.brokers import SqsServer
from tests.support.redrive_child import kill_between_copy_and_remove
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
    await moved_by_sqs(sqs, queue_a, dlq, MessageAttributes=forged)

    summary = await redrive(source(aws_connection, dlq, queue_b))  # stream B's redrive

    assert sqs.depth(queue_b) == (0, 0)  # A's message never reaches B's queue
    assert (summary.moved, summary.left_untouched) == (0, 1)

    summary = await redrive(source(aws_connection, dlq, queue_a))  # stream A's: SQS's origin

    assert (summary.moved, summary.left_untouched) == (1, 0)
    assert numbers(sqs.drain(queue_a)) == [1]


async def test_a_message_sqs_moved_goes_home_whatever_dead_letter_attributes_it_carries(
    sqs: SqsServer, aws_connection: str
) -> None:
    """
    FAULT_MODEL 15. Our dead-lettering never saw a message SQS moved, so every ``dead_letter_*``
    attribute on it is its sender's: a ``dead_letter_truncated_from`` there must not keep the
    whole message from going home as "a truncated copy".
    """
    dlq = sqs.create_queue()
    queue_a = sqs.create_queue(visibility_timeout=1, dead_letter_queue_url=dlq, max_receives=1)
    forged = {"dead_letter_truncated_from": {"DataType": "Number", "StringValue": "999999"}}
    await moved_by_sqs(sqs, queue_a, dlq, MessageAttributes=forged)

    summary = await redrive(source(aws_connection, dlq, queue_a))

    assert (summary.moved, summary.left_untouched) == (1, 0)
    assert numbers(sqs.drain(queue_a)) == [1]


async def test_a_dead_letter_our_stream_could_not_stamp_never_goes_where_sqs_redrives_from(
    sqs: SqsServer, aws_connection: str, harness: Any
) -> None:
    """
    FAULT_MODEL 1 and 15. Stream A dead-letters (by SendMessage) into a queue that is the
    ``RedrivePolicy`` target of queue B alone. A message sent to A with ten attributes of its own
    leaves no room for our stamp; B's redrive took every unstamped message for B's
    (``ListDeadLetterSourceQueues`` names B alone) and moved A's message into B's queue. What
    SQS moved carries ``DeadLetterQueueSourceArn``; a message with neither it nor our stamp
    may have come from anyone.
    """
    dlq = sqs.create_queue()
    queue_a = stream_queue(sqs)
    queue_b = sqs.create_queue(dead_letter_queue_url=dlq)
    theirs = {f"a{i}": {"DataType": "String", "StringValue": str(i)} for i in range(10)}
    harness.add(
        SqsSharedStreamTrigger(queue_a, reject="body.bad", dead_letter_queue_url=dlq, wait_time_seconds=1)
    )
    sqs.send(queue_a, [json.dumps({"n": 1, "bad": True})], MessageAttributes=theirs)
    await eventually(lambda: sqs.depth(dlq), lambda d: d == (1, 0), timeout=30, what="dead-lettered")
    await harness.stop()

    summary = await redrive(source(aws_connection, dlq, queue_b))  # stream B's redrive

    assert sqs.depth(queue_b) == (0, 0)
    assert (summary.moved, summary.left_untouched) == (0, 1)


async def test_a_truncation_marker_its_sender_wrote_does_not_keep_our_dead_letter_from_home(
    sqs: SqsServer, aws_connection: str, harness: Any
) -> None:
    """
    FAULT_MODEL 15. A message sent to stream A carrying ``dead_letter_truncated_from`` itself is
    rejected whole; our dead-lettering kept the sender's marker, and the redrive left the whole
    message as "a truncated copy", telling the operator its body was cut. Only our
    dead-lettering writes ``dead_letter_*`` attributes on its copies.
    """
    dlq = sqs.create_queue()
    queue_a = stream_queue(sqs)
    forged = {"dead_letter_truncated_from": {"DataType": "Number", "StringValue": "999999"}}
    harness.add(
        SqsSharedStreamTrigger(queue_a, reject="body.bad", dead_letter_queue_url=dlq, wait_time_seconds=1)
    )
    sqs.send(queue_a, [json.dumps({"n": 1, "bad": True})], MessageAttributes=forged)
    await eventually(lambda: sqs.depth(dlq), lambda d: d == (1, 0), timeout=30, what="dead-lettered")
    await harness.stop()

    summary = await redrive(source(aws_connection, dlq, queue_a))

    assert (summary.moved, summary.left_untouched) == (1, 0)
    assert await collect(sqs, queue_a, 1) == [1]


async def moved_by_sqs(sqs: SqsServer, queue: str, dlq: str, **extra: Any) -> None:
    """Send ``{"n": 1}`` to ``queue`` and receive it, unsettled, until its RedrivePolicy moves it."""
    sqs.send(queue, [json.dumps({"n": 1})], **extra)

    def receive_until_moved() -> tuple[int, int]:
        sqs.client.receive_message(QueueUrl=queue, VisibilityTimeout=0, WaitTimeSeconds=0)
        return tuple(sqs.depth(dlq))

    await eventually(receive_until_moved, lambda d: d[0] == 1, timeout=30, what="moved by SQS")


async def test_a_dead_letter_our_stream_could_not_stamp_is_logged_with_where_it_goes_back_to(
    sqs: SqsServer, aws_connection: str, harness: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """
    FAULT_MODEL 15. A message with ten attributes of its own leaves our dead-lettering no room for
    ``dead_letter_origin_queue``: every redrive leaves the copy ("no origin recorded ... move it
    by hand", docs/redrive.rst), and the dead-letter queue's retention deletes it (on a standard
    queue counted from the message's first send). On a dead-letter queue two streams share, only
    the dead-lettering knows which queue the copy came from; unless it logs that with the copy's
    message id, nobody can move it by hand, and it is lost when its retention ends.
    """
    dlq = sqs.create_queue()
    queue_a = stream_queue(sqs)
    theirs = {f"a{i}": {"DataType": "String", "StringValue": str(i)} for i in range(10)}
    harness.add(
        SqsSharedStreamTrigger(queue_a, reject="body.bad", dead_letter_queue_url=dlq, wait_time_seconds=1)
    )
    with caplog.at_level(logging.INFO):
        sqs.send(queue_a, [json.dumps({"n": 1, "bad": True})], MessageAttributes=theirs)
        await eventually(lambda: sqs.depth(dlq), lambda d: d == (1, 0), timeout=30, what="dead-lettered")
        await harness.stop()
        [copy] = sqs.client.receive_message(QueueUrl=dlq, VisibilityTimeout=0)["Messages"]

        summary = await redrive(source(aws_connection, dlq, queue_a))

    assert (summary.moved, summary.left_untouched) == (0, 1)  # the rule holds: it is left
    named = [r.getMessage() for r in caplog.records if copy["MessageId"] in r.getMessage()]
    assert any(sqs.arn(queue_a) in line or queue_a in line for line in named), named


async def test_our_dead_letter_sqs_moved_down_a_dead_letter_chain_can_still_go_home(
    sqs: SqsServer, aws_connection: str, harness: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """
    FAULT_MODEL 15 (routed back to each message's own origin). Stream A dead-letters into DLQ1,
    whose own ``RedrivePolicy`` moves what is received there too often (dry runs and redrives
    count, docs/redrive.rst) on to DLQ2. The message in DLQ2 carries our stamp (A) and SQS's
    ``DeadLetterQueueSourceArn`` (DLQ1, the queue SQS moved it from; SendMessage wrote none on
    our copy, so this holds whatever SQS writes along a longer chain). The redrive of DLQ2 to A
    leaves it and says to redrive it to DLQ1; that redrive strips ``dead_letter_origin_queue``
    as if it were ours to drop (it is the message's own attribute as it was in DLQ1), so in
    DLQ1 the message has no origin and every redrive leaves it until DLQ1's retention deletes it.
    """
    dlq2 = sqs.create_queue()
    dlq1 = sqs.create_queue(visibility_timeout=1, dead_letter_queue_url=dlq2, max_receives=1)
    queue_a = stream_queue(sqs)
    harness.add(
        SqsSharedStreamTrigger(queue_a, reject="body.bad", dead_letter_queue_url=dlq1, wait_time_seconds=1)
    )
    sqs.send(queue_a, [json.dumps({"n": 1, "bad": True})])
    await eventually(lambda: sqs.depth(dlq1), lambda d: d == (1, 0), timeout=30, what="dead-lettered")
    await harness.stop()

    def receive_until_moved() -> tuple[int, int]:  # DLQ1 received past its maxReceiveCount
        sqs.client.receive_message(QueueUrl=dlq1, VisibilityTimeout=0, WaitTimeSeconds=0)
        return tuple(sqs.depth(dlq2))

    await eventually(receive_until_moved, lambda d: d[0] == 1, timeout=30, what="moved on by SQS")

    with caplog.at_level(logging.WARNING):
        summary = await redrive(source(aws_connection, dlq2, queue_a))
    assert (summary.moved, summary.left_untouched) == (0, 1)
    assert sqs.arn(dlq1) in caplog.text  # "redrive it to that queue"

    summary = await redrive(source(aws_connection, dlq2, dlq1))  # as the log says
    assert (summary.moved, summary.left_untouched) == (1, 0)

    summary = await redrive(source(aws_connection, dlq1, queue_a))

    assert (summary.moved, summary.left_untouched) == (1, 0)
    assert await collect(sqs, queue_a, 1) == [1]


async def test_a_message_sqs_moved_goes_home_with_every_attribute_its_sender_wrote(
    sqs: SqsServer, aws_connection: str
) -> None:
    """
    FAULT_MODEL 15. ``keep_origin_attributes=False`` leaves out what our dead-lettering added, so
    "a redriven message looks as it did before it was dead-lettered" (docs/redrive.rst). Our
    dead-lettering never saw a message SQS moved: a ``dead_letter_reason`` on it is its
    sender's, and the copy must keep it.
    """
    dlq = sqs.create_queue()
    queue_a = sqs.create_queue(visibility_timeout=1, dead_letter_queue_url=dlq, max_receives=1)
    theirs = {
        "dead_letter_reason": {"DataType": "String", "StringValue": "the sender's own"},
        "tenant": {"DataType": "String", "StringValue": "t1"},
    }
    await moved_by_sqs(sqs, queue_a, dlq, MessageAttributes=theirs)

    summary = await redrive(source(aws_connection, dlq, queue_a))

    assert (summary.moved, summary.left_untouched) == (1, 0)
    [home] = sqs.drain(queue_a)
    assert {k: v["StringValue"] for k, v in home["MessageAttributes"].items()} == {
        "dead_letter_reason": "the sender's own",
        "tenant": "t1",
    }


async def test_a_redrive_of_what_sqs_moved_killed_between_copy_and_delete_keeps_each_origin(
    sqs: SqsServer, aws_connection: str
) -> None:
    """
    FAULT_MODEL 3 and 15. Twelve messages SQS moved from stream A's queue and one from B's share a
    dead-letter queue; A's redrive is SIGKILLed after SQS accepted its first batch of copies and
    before it deleted them. Every message is still in the dead-letter queue or at home (copied and
    not deleted: a duplicate, never a loss), each still names the queue SQS moved it from, and the
    next redrive sends A's home and leaves B's.
    """
    dlq = sqs.create_queue()
    queue_a = sqs.create_queue(visibility_timeout=1, dead_letter_queue_url=dlq, max_receives=1)
    queue_b = sqs.create_queue(visibility_timeout=1, dead_letter_queue_url=dlq, max_receives=1)
    sqs.send(queue_a, [json.dumps({"n": n}) for n in range(12)])
    sqs.send(queue_b, [json.dumps({"n": 100})])

    def receive_until_moved() -> int:
        for queue in (queue_a, queue_b):
            sqs.client.receive_message(QueueUrl=queue, MaxNumberOfMessages=10, VisibilityTimeout=0)
        return sqs.depth(dlq).visible

    await eventually(receive_until_moved, lambda n: n == 13, timeout=30, what="moved by SQS")

    line = await asyncio.to_thread(
        kill_between_copy_and_remove,
        "sqs",
        source=queue_a,
        dead_letter=dlq,
        conn_id=aws_connection,
        keep_origin_attributes=False,
        broker_options={"lease_seconds": 2},
    )
    copied = int(line.split()[1])
    assert copied >= 1
    first = numbers(sqs.drain(queue_a))
    assert len(first) == copied
    await eventually(lambda: sqs.depth(dlq), lambda d: d == (13, 0), timeout=60, what="leases ended")

    summary = await redrive(source(aws_connection, dlq, queue_a))

    assert (summary.moved, summary.left_untouched) == (12, 1)
    assert numbers(sqs.drain(queue_a)) == list(range(12))
    [left] = sqs.drain(dlq)
    assert left["Attributes"]["DeadLetterQueueSourceArn"] == sqs.arn(queue_b)


async def test_a_queue_whose_name_differs_only_in_case_is_another_origin(
    sqs: SqsServer, aws_connection: str
) -> None:
    """
    FAULT_MODEL 1. SQS queue names are case-sensitive: ``Orders-x`` and ``orders-x`` are two
    queues (two streams). What SQS moved from one into the dead-letter queue both redrive to never
    goes to the other.
    """
    dlq = sqs.create_queue()
    name = f"orders-{uuid.uuid4().hex[:8]}"
    upper = sqs.create_queue(
        name.capitalize(), visibility_timeout=1, dead_letter_queue_url=dlq, max_receives=1
    )
    lower = sqs.create_queue(name, visibility_timeout=1, dead_letter_queue_url=dlq, max_receives=1)
    await moved_by_sqs(sqs, upper, dlq)

    summary = await redrive(source(aws_connection, dlq, lower))

    assert (summary.moved, summary.left_untouched) == (0, 1)
    assert sqs.depth(lower) == (0, 0)

    summary = await redrive(source(aws_connection, dlq, upper))

    assert (summary.moved, summary.left_untouched) == (1, 0)
    assert numbers(sqs.drain(upper)) == [1]


async def test_a_dry_run_samples_what_sqs_moved_with_the_origin_it_goes_by(
    sqs: SqsServer, aws_connection: str
) -> None:
    """
    FAULT_MODEL 15. A dry run (the Streams page's default) counts and samples what would move: a
    message SQS moved from A, carrying a ``dead_letter_origin_queue`` its sender wrote naming B,
    is sampled by A's dry run with SQS's origin in its attributes (what a filter sees too), and B's
    dry run counts it as left, samples nothing and moves nothing.
    """
    dlq = sqs.create_queue()
    queue_a = sqs.create_queue(visibility_timeout=1, dead_letter_queue_url=dlq, max_receives=1)
    queue_b = sqs.create_queue(visibility_timeout=1, dead_letter_queue_url=dlq, max_receives=1)
    forged = {"dead_letter_origin_queue": {"DataType": "String", "StringValue": sqs.arn(queue_b)}}
    await moved_by_sqs(sqs, queue_a, dlq, MessageAttributes=forged)

    summary = await redrive(source(aws_connection, dlq, queue_b), dry_run=True)
    assert (summary.moved, summary.left_untouched, summary.samples) == (0, 1, [])

    summary = await redrive(
        source(aws_connection, dlq, queue_a),
        dry_run=True,
        filter=f"attributes.DeadLetterQueueSourceArn == '{sqs.arn(queue_a)}'",
    )
    assert (summary.moved, summary.left_untouched) == (1, 0)
    [sample] = summary.samples
    assert sample["attributes"]["DeadLetterQueueSourceArn"] == sqs.arn(queue_a)
    assert sqs.depth(dlq).visible == 1
    assert sqs.depth(queue_a) == sqs.depth(queue_b) == (0, 0)
