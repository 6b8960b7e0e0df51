"""
Where an SQS redrive writes, against moto's server: each dead letter goes home or is left
untouched (a dead-letter queue shared by two streams, SQS's own dead letters, truncated copies),
and copies go in batches SQS accepts (docs/redrive.rst).
"""

from __future__ import annotations

import json
import logging
from typing import Any

import pytest

from airflow_shared_stream.common.redrive import redrive
from airflow_shared_stream.redrive import dead_letter_source
from airflow_shared_stream.sqs.trigger import SqsSharedStreamTrigger
from tests.support.brokers import SqsServer
from tests.support.waiting import eventually

pytestmark = pytest.mark.integration


def source(aws_connection: str, dlq: str, origin: str) -> Any:
    return dead_letter_source(
        "sqs", source=origin, dead_letter=dlq, conn_id=aws_connection, broker_options={"lease_seconds": 30}
    )


def numbers(messages: list[dict[str, Any]]) -> list[int]:
    return sorted(json.loads(m["Body"])["n"] for m in messages)


async def collect(sqs: SqsServer, queue: str, count: int) -> list[int]:
    """
    The numbers of ``count`` messages drained from ``queue``, then nothing more there. A stopped
    stream's last long poll may still be handed one (it comes back after the short visibility).
    """
    got: list[dict[str, Any]] = []
    await eventually(
        lambda: got.extend(sqs.drain(queue)) or len(got), lambda n: n >= count, timeout=30, what=queue
    )
    assert sqs.depth(queue) == (0, 0)
    return numbers(got)


def stream_queue(sqs: SqsServer) -> str:
    return sqs.create_queue(visibility_timeout=1)


async def dead_letter_through_streams(
    sqs: SqsServer, harness: Any, dlq: str, sends: dict[str, list[int]]
) -> None:
    """Each queue's stream rejects what is sent to it into ``dlq`` (our dead-lettering, for real)."""
    for queue in sends:
        harness.add(
            SqsSharedStreamTrigger(queue, reject="body.bad", dead_letter_queue_url=dlq, wait_time_seconds=1)
        )
    for queue, ns in sends.items():
        sqs.send(queue, [json.dumps({"n": n, "bad": True}) for n in ns])
    total = sum(len(ns) for ns in sends.values())
    await eventually(lambda: sqs.depth(dlq), lambda d: d == (total, 0), timeout=30, what="dead-lettered")
    await harness.stop()  # nothing reads the sources while the redrive writes to them


async def test_a_dead_letter_queue_shared_by_two_streams_sends_each_message_home(
    sqs: SqsServer, aws_connection: str, harness: Any
) -> None:
    dlq = sqs.create_queue()
    queue_a, queue_b = stream_queue(sqs), stream_queue(sqs)
    await dead_letter_through_streams(sqs, harness, dlq, {queue_a: [1, 2, 3], queue_b: [10, 11]})

    summary = await redrive(source(aws_connection, dlq, queue_a))

    assert await collect(sqs, queue_a, 3) == [1, 2, 3]  # stream B's letters never reach A's queue
    assert sqs.depth(queue_b) == (0, 0)
    assert sqs.depth(dlq) == (2, 0)  # B's are left where they were, untouched, visible again
    assert (summary.moved, summary.left_untouched, summary.failed) == (3, 2, 0)

    summary = await redrive(source(aws_connection, dlq, queue_b))

    assert await collect(sqs, queue_b, 2) == [10, 11]
    assert (summary.moved, summary.left_untouched) == (2, 0)
    assert sqs.depth(dlq) == (0, 0)


async def test_what_sqs_moved_goes_home_by_the_source_sqs_names_and_nothing_else_unstamped_does(
    sqs: SqsServer, aws_connection: str
) -> None:
    """
    What SQS moved itself (``maxReceiveCount``) carries no stamp of ours but SQS's own
    ``DeadLetterQueueSourceArn``: from a dead-letter queue two queues redrive to, each goes home.
    A message with neither is left, even where one queue alone redrives to the dead-letter queue:
    anyone may have sent it there.
    """
    shared_dlq = sqs.create_queue()
    first, second = (
        sqs.create_queue(visibility_timeout=1, dead_letter_queue_url=shared_dlq, max_receives=1)
        for _ in range(2)
    )
    sqs.send(first, [json.dumps({"n": n}) for n in range(3)])
    sqs.send(second, [json.dumps({"n": 10})])

    def receive_until_moved() -> int:
        for queue in (first, second):
            sqs.client.receive_message(QueueUrl=queue, MaxNumberOfMessages=10, VisibilityTimeout=0)
        return sqs.depth(shared_dlq).visible

    await eventually(receive_until_moved, lambda n: n == 4, timeout=30, what="moved by SQS")

    summary = await redrive(source(aws_connection, shared_dlq, first))

    assert numbers(sqs.drain(first)) == [0, 1, 2]
    assert sqs.depth(second) == (0, 0)
    assert (summary.moved, summary.left_untouched) == (3, 1)

    own_dlq = sqs.create_queue()
    origin = sqs.create_queue(dead_letter_queue_url=own_dlq)  # the only queue that redrives here
    sqs.send(own_dlq, [json.dumps({"n": n}) for n in range(3)])

    summary = await redrive(source(aws_connection, own_dlq, origin))

    assert sqs.depth(origin) == (0, 0)
    assert numbers(sqs.drain(own_dlq)) == [0, 1, 2]
    assert (summary.moved, summary.left_untouched) == (0, 3)


async def test_a_truncated_dead_letter_is_never_put_back_as_the_original(
    sqs: SqsServer, aws_connection: str, harness: Any, caplog: pytest.LogCaptureFixture
) -> None:
    dlq = sqs.create_queue(MaximumMessageSize="1024")  # our dead-lettering cuts what does not fit
    origin = stream_queue(sqs)
    harness.add(
        SqsSharedStreamTrigger(origin, reject="body.bad", dead_letter_queue_url=dlq, wait_time_seconds=1)
    )
    sqs.send(origin, [json.dumps({"n": 0, "bad": True, "pad": "x" * 4000})])
    await eventually(lambda: sqs.depth(dlq), lambda d: d == (1, 0), timeout=30, what="dead-lettered")
    await harness.stop()

    with caplog.at_level(logging.WARNING):
        summary = await redrive(source(aws_connection, dlq, origin))

    assert await collect(sqs, origin, 0) == []  # the cut body is not sent as if it were the message
    assert (summary.moved, summary.left_untouched) == (0, 1)
    assert "a truncated copy" in caplog.text
    assert "recover the message from its producer" in caplog.text
    left = sqs.drain(dlq)
    assert len(left) == 1
    assert "dead_letter_truncated_from" in left[0]["MessageAttributes"]


async def test_copies_go_in_batches_sqs_accepts(sqs: SqsServer, aws_connection: str) -> None:
    """
    Ten messages of 120 KiB: one ``SendMessageBatch`` of them is over SQS's batch limit (256 KiB in
    the API reference; moto enforces 1 MiB, which ten of them exceed too).
    """
    dlq, origin = sqs.create_queue(), sqs.create_queue()
    home = {"dead_letter_origin_queue": {"DataType": "String", "StringValue": sqs.arn(origin)}}
    pad = "x" * (120 * 1024)
    for n in range(10):  # one at a time: they fit no batch together
        sqs.send(dlq, [json.dumps({"n": n, "pad": pad})], MessageAttributes=home)

    summary = await redrive(source(aws_connection, dlq, origin))

    assert (summary.moved, summary.failed) == (10, 0)
    assert numbers(sqs.drain(origin)) == list(range(10))
    assert sqs.depth(dlq) == (0, 0)
