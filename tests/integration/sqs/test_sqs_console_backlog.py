"""The Streams page's SQS backlog on moto: the source queue's and its dead-letter queue's counts."""

from __future__ import annotations

import pytest

from airflow_shared_stream.console import backlog
from airflow_shared_stream.console.backlog import broker_backlog
from tests.support.brokers import SqsServer

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


async def test_the_queue_and_its_dead_letter_queue_are_counted(
    sqs: SqsServer, aws_connection: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(backlog, "CACHE_SECONDS", 0.0)
    dead_letter_queue_url = sqs.create_queue()
    queue_url = sqs.create_queue(dead_letter_queue_url=dead_letter_queue_url)
    sqs.send(queue_url, [{"n": n} for n in range(3)])
    sqs.send(dead_letter_queue_url, [{"n": n} for n in range(2)])
    sqs.client.receive_message(QueueUrl=dead_letter_queue_url, MaxNumberOfMessages=1)  # one in flight

    found = await broker_backlog(
        "sqs",
        {
            "queue_url": queue_url,
            "aws_conn_id": aws_connection,
            "dead_letter_queue_url": dead_letter_queue_url,
        },
    )

    assert found is not None
    assert found["source"] == {"visible": 3, "in_flight": 0, "depth": 3}
    assert found["dead_letter"] == {"visible": 1, "in_flight": 1, "depth": 2}


async def test_pubsub_dead_letter_depth_is_not_reported_rather_than_counted_by_pulling() -> None:
    found = await broker_backlog("pubsub", {"subscription": "orders", "dead_letter_topic": "orders-dlq"})
    assert found is not None
    assert "not_reported" in found["dead_letter"]
    assert await broker_backlog("pubsub", {"subscription": "orders"}) is None
