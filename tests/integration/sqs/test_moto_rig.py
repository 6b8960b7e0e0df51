"""
The SQS rig itself: moto must not redeliver a message whose delete succeeded, nor hand one message
to two concurrent receives.

moto 5.2 deletes and receives without its queue's lock (tests/support/moto_sqs.py), and the
reliability runs charged the redeliveries that caused to the provider as duplicates. These tests
send the rig's server what a shared stream sends, delete batches or receives of one queue on
several connections at once, with the interpreter switching threads far more often than its
default, in three rounds each. On an unguarded server (without
:func:`~tests.support.moto_sqs.serialize_queue_mutations`) every round of three runs of the
delete test left 8 to 48 of the 200 messages on the queue, and each of three runs of the receive
test handed out 1 to 4 messages twice.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import boto3
import pytest

from tests.support.brokers import SqsServer

MESSAGES = 200
CONNECTIONS = 8
ROUNDS = 3


@pytest.fixture
def frequent_thread_switches() -> Iterator[None]:
    """Switch threads every 10 µs (the default is 5 ms), so a race shows within a few calls."""
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)
    try:
        yield
    finally:
        sys.setswitchinterval(interval)


def _queue_of_messages(sqs: SqsServer) -> str:
    """A new queue holding ``MESSAGES`` messages, with a visibility timeout no round outlasts."""
    queue_url = sqs.create_queue(visibility_timeout=60)
    sqs.send(queue_url, [{"n": n} for n in range(MESSAGES)])
    return queue_url


def _clients(sqs: SqsServer) -> list[Any]:
    """A client per thread, as separate consumers of one queue would have."""
    return [
        boto3.client(
            "sqs",
            endpoint_url=sqs.endpoint_url,
            region_name=sqs.region,
            aws_access_key_id=sqs.access_key,
            aws_secret_access_key=sqs.secret_key,
        )
        for _ in range(CONNECTIONS)
    ]


def _received_handles(sqs: SqsServer, queue_url: str) -> list[str]:
    handles: list[str] = []
    while len(handles) < MESSAGES:
        response = sqs.client.receive_message(QueueUrl=queue_url, MaxNumberOfMessages=10, WaitTimeSeconds=1)
        handles += [message["ReceiptHandle"] for message in response.get("Messages", ())]
    return handles


def _delete_concurrently(sqs: SqsServer) -> int:
    """Receive ``MESSAGES``, delete them in concurrent batches; return how many are still queued."""
    queue_url = _queue_of_messages(sqs)
    handles = _received_handles(sqs, queue_url)
    assert len(set(handles)) == MESSAGES
    clients = _clients(sqs)

    def delete_batch(batch: int) -> list[dict[str, str]]:
        chunk = handles[batch * 10 : (batch + 1) * 10]
        response = clients[batch % CONNECTIONS].delete_message_batch(
            QueueUrl=queue_url, Entries=[{"Id": str(i), "ReceiptHandle": h} for i, h in enumerate(chunk)]
        )
        return list(response.get("Failed", ()))

    with ThreadPoolExecutor(CONNECTIONS) as pool:
        failed = [f for failures in pool.map(delete_batch, range(MESSAGES // 10)) for f in failures]

    assert failed == []
    depth = sqs.depth(queue_url)
    return depth.visible + depth.in_flight


def _receive_concurrently(sqs: SqsServer) -> int:
    """Receive a queue of ``MESSAGES`` on several connections at once; return the extra copies."""
    queue_url = _queue_of_messages(sqs)
    clients = _clients(sqs)

    def receive(connection: int) -> list[str]:
        ids: list[str] = []
        while True:
            response = clients[connection].receive_message(
                QueueUrl=queue_url, MaxNumberOfMessages=10, WaitTimeSeconds=0
            )
            messages = response.get("Messages", ())
            if not messages:
                return ids
            ids += [message["MessageId"] for message in messages]

    with ThreadPoolExecutor(CONNECTIONS) as pool:
        ids = [i for received in pool.map(receive, range(CONNECTIONS)) for i in received]
    assert len(set(ids)) == MESSAGES
    return len(ids) - MESSAGES


@pytest.mark.parametrize(
    ("race", "what"),
    [
        (_delete_concurrently, "messages still on the queue after every delete of the round succeeded"),
        (_receive_concurrently, "messages handed out twice by concurrent receives, within their visibility"),
    ],
    ids=["delete", "receive"],
)
def test_concurrent_requests_on_one_queue(
    sqs: SqsServer, frequent_thread_switches: None, race: Callable[[SqsServer], int], what: str
) -> None:
    counts = [race(sqs) for _ in range(ROUNDS)]
    assert counts == [0] * ROUNDS, f"{what}, per round: {counts} (of {MESSAGES})"


def test_what_sqs_moves_to_a_dead_letter_queue_names_its_source_queue(sqs: SqsServer) -> None:
    """
    SQS writes ``DeadLetterQueueSourceArn`` on a message its ``RedrivePolicy`` moved, returned when
    asked for by name or with ``All`` (tests/support/moto_dead_letter_source.py); a message sent to
    the dead-letter queue has none, and a sender's system attribute of that name is not it.
    """
    dlq = sqs.create_queue()
    source = sqs.create_queue(visibility_timeout=1, dead_letter_queue_url=dlq, max_receives=1)
    forged = {"DeadLetterQueueSourceArn": {"DataType": "String", "StringValue": "arn:aws:sqs:x:1:other"}}
    sqs.client.send_message(QueueUrl=source, MessageBody="moved")
    sqs.client.send_message(QueueUrl=dlq, MessageBody="sent", MessageSystemAttributes=forged)
    sqs.client.receive_message(QueueUrl=source, VisibilityTimeout=0)
    while sqs.depth(dlq).visible < 2:  # the next receive past maxReceiveCount moves it
        assert sqs.client.receive_message(QueueUrl=source, VisibilityTimeout=0).get("Messages") is None

    def sources(names: list[str]) -> dict[str, str | None]:
        messages = sqs.client.receive_message(
            QueueUrl=dlq, MaxNumberOfMessages=10, VisibilityTimeout=0, MessageSystemAttributeNames=names
        )["Messages"]
        return {m["Body"]: m.get("Attributes", {}).get("DeadLetterQueueSourceArn") for m in messages}

    assert sources(["DeadLetterQueueSourceArn"]) == {"moved": sqs.arn(source), "sent": None}
    assert sources(["All"]) == {"moved": sqs.arn(source), "sent": None}
    assert sources(["SentTimestamp"]) == {"moved": None, "sent": None}


def test_what_sqs_moves_to_a_fifo_dead_letter_queue_is_kept_whatever_its_deduplication_id(
    sqs: SqsServer,
) -> None:
    """
    FAULT_MODEL 16. SQS replaces the deduplication id of a message it moves to a FIFO dead-letter
    queue with the message's id, "to make sure that the DLQ deduplication will not prevent
    storing of two independent messages that happen to share a deduplication ID" (SQS Developer
    Guide, "Configuring a dead-letter queue redrive"). Two FIFO queues that share a dead-letter
    queue (two streams) each get a message with one deduplication id (content-based
    deduplication of one body does the same): SQS moves both. moto moves the message object with
    its own deduplication id, and the dead-letter queue's deduplication drops the second: a
    message the service keeps, lost on the test server.
    """
    dlq = sqs.create_queue(fifo=True)
    queues = [
        sqs.create_queue(fifo=True, visibility_timeout=1, dead_letter_queue_url=dlq, max_receives=1)
        for _ in range(2)
    ]
    for queue in queues:
        sqs.client.send_message(
            QueueUrl=queue, MessageBody=queue, MessageGroupId="g", MessageDeduplicationId="one-id"
        )
    for queue in queues:  # received once (its maxReceiveCount), then moved by the next receive
        assert sqs.client.receive_message(QueueUrl=queue, VisibilityTimeout=0).get("Messages")
        assert sqs.client.receive_message(QueueUrl=queue, VisibilityTimeout=0).get("Messages") is None
        assert sqs.depth(queue) == (0, 0)

    moved = sqs.drain(dlq)

    assert sorted(m["Body"] for m in moved) == sorted(queues)
    for message in moved:
        assert message["Attributes"]["MessageDeduplicationId"] == message["MessageId"]
        assert message["Attributes"]["DeadLetterQueueSourceArn"] == sqs.arn(message["Body"])
