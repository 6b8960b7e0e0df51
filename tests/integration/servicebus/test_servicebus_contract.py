"""Service Bus passes the shared-stream contract (tests/integration/contract) against the AMQP test server."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import pytest

from airflow_shared_stream.servicebus.trigger import ServiceBusSharedStreamTrigger
from tests.integration.contract.base import (
    ContractBroker,
    LeasedQueueContract,
    OrderedDeliveryBudgetContract,
    OrderedLanesContract,
    SharedStreamContract,
)
from tests.support.servicebus_server import ServiceBusServer

pytestmark = pytest.mark.integration


@dataclass
class ServiceBusStream:
    queue: str
    lock_seconds: int
    sessions: bool


class ServiceBusContractBroker(ContractBroker):
    lease_seconds_min = 5
    """Service Bus's shortest lock duration."""
    give_back_spends_attempt = False

    def __init__(self, server: ServiceBusServer) -> None:
        self.server = server

    def create_stream(
        self,
        *,
        dead_letter: bool = True,
        lease_seconds: int = 30,
        ordered: bool = False,
        max_deliveries: int | None = None,
    ) -> ServiceBusStream:
        # Every Service Bus entity has its dead-letter sub-queue; ``dead_letter`` cannot remove it.
        lock = max(self.lease_seconds_min, min(lease_seconds, 300))
        limit = {"max_delivery_count": max_deliveries} if max_deliveries else {}
        queue = self.server.create_queue(lock_duration=lock, requires_session=ordered, **limit)
        return ServiceBusStream(queue=queue, lock_seconds=lock, sessions=ordered)

    def publish(self, stream: ServiceBusStream, bodies: list[Any], *, lane: str | None = None) -> list[str]:
        extra = {"session_id": lane or "default"} if stream.sessions else {}
        return self.server.send(stream.queue, bodies, **extra)

    def message_id(self, payload: dict[str, Any]) -> str:
        return payload["message_id"]

    def attempts_spent(self, payload: dict[str, Any]) -> int:
        return int(payload["delivery_count"])  # the AMQP header's count: 0 on the first delivery

    def remaining(self, stream: ServiceBusStream) -> int:
        return len(self.server.messages(stream.queue))

    def leased(self, stream: ServiceBusStream) -> int:
        return self.server.locked_count(stream.queue)

    def dead_letters(self, stream: ServiceBusStream) -> list[Any]:
        return [json.loads(m.body) for m in self.server.take_dead_letters(stream.queue)]

    def break_dead_letter(self, stream: ServiceBusStream) -> None:
        self.server.refuse_dead_letters(stream.queue)

    def trigger(self, stream: ServiceBusStream, **kwargs: Any) -> ServiceBusSharedStreamTrigger:
        return ServiceBusSharedStreamTrigger(
            stream.queue,
            max_wait_time=1,
            session_enabled=stream.sessions,
            **kwargs,
        )


class TestServiceBusContract(
    SharedStreamContract, OrderedLanesContract, OrderedDeliveryBudgetContract, LeasedQueueContract
):
    @pytest.fixture
    def contract_broker(self, servicebus, servicebus_connection) -> ServiceBusContractBroker:
        return ServiceBusContractBroker(servicebus)
