"""SQS passes the shared-stream contract (tests/integration/contract) against moto's server."""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from typing import Any

import pytest

from airflow_shared_stream.sqs.trigger import SqsSharedStreamTrigger
from tests.integration.contract.base import (
    ContractBroker,
    LeasedQueueContract,
    OrderedDeliveryBudgetContract,
    OrderedLanesContract,
    SharedStreamContract,
)
from tests.support.brokers import SqsServer

pytestmark = pytest.mark.integration


@dataclass
class SqsStream:
    url: str
    dead_letter_url: str | None
    fifo: bool


class SqsContractBroker(ContractBroker):
    lease_seconds_min = 2

    def __init__(self, sqs: SqsServer) -> None:
        self.sqs = sqs

    def create_stream(
        self,
        *,
        dead_letter: bool = True,
        lease_seconds: int = 30,
        ordered: bool = False,
        max_deliveries: int | None = None,
    ) -> SqsStream:
        dlq = self.sqs.create_queue(fifo=ordered) if dead_letter or max_deliveries else None
        redrive = {"dead_letter_queue_url": dlq, "max_receives": max_deliveries} if max_deliveries else {}
        url = self.sqs.create_queue(fifo=ordered, visibility_timeout=lease_seconds, **redrive)
        return SqsStream(url=url, dead_letter_url=dlq, fifo=ordered)

    def attempts_spent(self, payload: dict[str, Any]) -> int:
        return int(payload["attributes"]["ApproximateReceiveCount"]) - 1

    def publish(self, stream: SqsStream, bodies: list[Any], *, lane: str | None = None) -> list[str]:
        extra: dict[str, Any] = {}
        if stream.fifo:
            extra = {
                "MessageGroupId": lane or "default",
                "MessageDeduplicationId": lambda i: uuid.uuid4().hex,
            }
        ids = []
        for body in bodies:  # one at a time: bodies may be large
            ids.extend(self.sqs.send(stream.url, [body], **extra))
        return ids

    def message_id(self, payload: dict[str, Any]) -> str:
        return payload["message_id"]

    def remaining(self, stream: SqsStream) -> int:
        depth = self.sqs.depth(stream.url)
        return depth.visible + depth.in_flight

    def leased(self, stream: SqsStream) -> int:
        return self.sqs.depth(stream.url).in_flight

    def dead_letters(self, stream: SqsStream) -> list[Any]:
        assert stream.dead_letter_url is not None
        return [json.loads(m["Body"]) for m in self.sqs.drain(stream.dead_letter_url)]

    def break_dead_letter(self, stream: SqsStream) -> None:
        assert stream.dead_letter_url is not None
        self.sqs.client.delete_queue(QueueUrl=stream.dead_letter_url)

    def trigger(self, stream: SqsStream, **kwargs: Any) -> SqsSharedStreamTrigger:
        # Short polls on FIFO queues: moto only sees a group unlock when a poll starts.
        kwargs.setdefault("wait_time_seconds", 1 if stream.fifo else 5)
        return SqsSharedStreamTrigger(stream.url, dead_letter_queue_url=stream.dead_letter_url, **kwargs)


class TestSqsContract(
    SharedStreamContract, OrderedLanesContract, OrderedDeliveryBudgetContract, LeasedQueueContract
):
    @pytest.fixture
    def contract_broker(self, sqs, aws_connection) -> SqsContractBroker:
        return SqsContractBroker(sqs)
