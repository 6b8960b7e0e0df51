"""Service Bus's contract adapter (tests/integration/contract/broker.py) on the AMQP test server."""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest

from airflow_shared_stream.common.metrics import stream_label
from airflow_shared_stream.servicebus.trigger import ServiceBusSharedStreamTrigger
from tests.integration.contract.broker import BrokenConnection, ConnectionFailure, ContractBroker, DeadLetters
from tests.support.processes import free_port
from tests.support.servicebus_server import ServiceBusServer

OVER_LIMIT_REASON = "MaxDeliveryCountExceeded"
"""The reason Service Bus gives a message it dead-letters past ``MaxDeliveryCount``."""

WRONG_KEY = "d3Jvbmcta2V5LWFsc28tc2VjcmV0LTQ0"


@dataclass
class ServiceBusStream:
    queue: str
    lock_seconds: int
    sessions: bool


class ServiceBusContractBroker(ContractBroker):
    broker = "servicebus"
    conn_id_argument = "azure_service_bus_conn_id"
    lease_seconds_min = 5
    """Service Bus's shortest lock duration."""
    give_back_spends_attempt = False

    def __init__(self, server: ServiceBusServer) -> None:
        self.server = server
        assert server.sas_keys, "the adapter's connections sign with the server's own SAS key"
        self.key_name, self.key = next(iter(server.sas_keys.items()))

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

    def create_limited_stream(self, *, lease_seconds: int, max_deliveries: int) -> ServiceBusStream:
        return self.create_stream(lease_seconds=lease_seconds, max_deliveries=max_deliveries)

    def take_dead_letters(self, stream: ServiceBusStream) -> DeadLetters:
        """
        An entity has one dead-letter sub-queue: what the broker moved past ``MaxDeliveryCount``
        is told apart from the reject's by the reason the broker gives it.
        """
        letters = DeadLetters(rejected=[], over_limit=[])
        for message in self.server.take_dead_letters(stream.queue):
            over = message.application_properties.get("DeadLetterReason") == OVER_LIMIT_REASON
            (letters.over_limit if over else letters.rejected).append(json.loads(message.body))
        return letters

    def delivery_limit(self, stream: ServiceBusStream) -> int | None:
        return self.server.max_delivery_count(stream.queue)

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
        kwargs.setdefault("max_wait_time", 1)
        return ServiceBusSharedStreamTrigger(stream.queue, session_enabled=stream.sessions, **kwargs)

    def metric_prefix(self, stream: ServiceBusStream) -> str:
        return f"airflow.shared_stream.servicebus.{stream_label(stream.queue)}"

    def metric_secrets(self) -> list[str]:
        return [self.key]

    def other_shape(self, stream: ServiceBusStream) -> dict[str, Any]:
        return {"max_wait_time": 2}  # the entity's dead-letter sub-queue is its own: no argument

    def missing_upstream(self, request: pytest.FixtureRequest) -> BrokenConnection:
        return BrokenConnection(ServiceBusSharedStreamTrigger("no-such-queue"), self.key)

    def refused_credentials(self, request: pytest.FixtureRequest) -> BrokenConnection:
        connection = self.server.connection(key_name=self.key_name, key=WRONG_KEY)
        self.use_connection(request, "azure_service_bus_default", connection)
        return BrokenConnection(ServiceBusSharedStreamTrigger(self.server.create_queue()), WRONG_KEY)

    def unreachable_endpoint(self, request: pytest.FixtureRequest) -> BrokenConnection:
        schema = (
            f"Endpoint=sb://127.0.0.1:{free_port()};SharedAccessKeyName={self.key_name};"
            f"SharedAccessKey={self.key};UseDevelopmentEmulator=true;"
        )
        connection = {"conn_type": "azure_service_bus", "schema": schema}
        self.use_connection(request, "azure_service_bus_default", connection)
        return BrokenConnection(ServiceBusSharedStreamTrigger("orders"), self.key)

    def use_secret_connection(
        self,
        request: pytest.FixtureRequest,
        conn_id: str,
        secret: str,
        failure: ConnectionFailure | None = None,
    ) -> dict[str, Any]:
        """The connection string's ``SharedAccessKey``; refused: the server knows another key by that name."""
        self.server.sas_keys["SentinelKey"] = "not-the-sentinel" if failure == "auth" else secret
        port = free_port() if failure == "endpoint" else self.server.port
        schema = (
            f"Endpoint=sb://127.0.0.1:{port};SharedAccessKeyName=SentinelKey;"
            f"SharedAccessKey={secret};UseDevelopmentEmulator=true;"
        )
        connection = {"conn_type": "azure_service_bus", "schema": schema}
        return self.use_connection(request, conn_id, connection)

    def use_misconfigured_connection(
        self, request: pytest.FixtureRequest, conn_id: str, secret: str
    ) -> tuple[dict[str, Any], str]:
        schema = f"Endpoint=nonsense;SharedAccessKeyName=SentinelKey;SharedAccessKey={secret}"
        return self.use_connection(
            request, conn_id, {"conn_type": "azure_service_bus", "schema": schema}
        ), "not a Service Bus connection string"

    def bad_arguments(self) -> dict[str, Callable[[], object]]:
        trigger = ServiceBusSharedStreamTrigger
        return {
            "no entity": trigger,
            "a queue and a topic": functools.partial(trigger, "q", topic_name="t"),
            "a topic without a subscription": functools.partial(trigger, topic_name="t"),
            "max_wait_time 0": functools.partial(trigger, "q", max_wait_time=0),
        }
