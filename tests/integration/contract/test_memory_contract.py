"""
The example broker of docs/writing-a-broker.rst (docs/examples/memory_broker.py) passes the contract.

It keeps the page honest: the classes and calls it shows are the ones a broker package uses, and
an in-memory queue written to them behaves as the four real brokers do.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from docs.examples.memory_broker import NAMESPACES, MemoryQueue, MemorySharedStreamTrigger
from tests.integration.contract.broker import ContractBroker
from tests.integration.contract.shape_conflict import ShapeConflictContract
from tests.integration.contract.stream import SharedStreamContract

pytestmark = pytest.mark.integration

NAMESPACE = "contract"


@dataclass
class MemoryStream:
    queue: str
    dead_letter_queue: str


class MemoryContractBroker(ContractBroker):
    broker = "memory"
    lease_seconds_min = 2
    gives_back_on_close = False

    @property
    def queues(self) -> dict[str, MemoryQueue]:
        return NAMESPACES.setdefault(NAMESPACE, {})

    def create_stream(
        self,
        *,
        dead_letter: bool = True,
        lease_seconds: int = 30,
        ordered: bool = False,
        max_deliveries: int | None = None,
    ) -> MemoryStream:
        name = f"q-{uuid.uuid4().hex[:8]}"
        self.queues[name] = MemoryQueue(lease_seconds)
        self.queues[f"{name}-dlq"] = MemoryQueue(lease_seconds)
        return MemoryStream(name, f"{name}-dlq")

    def publish(self, stream: MemoryStream, bodies: list[Any], *, lane: str | None = None) -> list[str]:
        return [self.queues[stream.queue].send(json.dumps(body).encode()) for body in bodies]

    def message_id(self, payload: dict[str, Any]) -> str:
        return payload["message_id"]

    def remaining(self, stream: MemoryStream) -> int:
        return self.queues[stream.queue].count()

    def leased(self, stream: MemoryStream) -> int:
        return self.queues[stream.queue].count(leased_only=True)

    def dead_letters(self, stream: MemoryStream) -> list[Any]:
        return [json.loads(body) for body in self.queues[stream.dead_letter_queue].take_all()]

    def break_dead_letter(self, stream: MemoryStream) -> None:
        self.queues[stream.dead_letter_queue].gone = True

    def trigger(self, stream: MemoryStream, **kwargs: Any) -> MemorySharedStreamTrigger:
        kwargs.setdefault("dead_letter_queue", stream.dead_letter_queue)
        return MemorySharedStreamTrigger(stream.queue, **kwargs)

    def other_shape(self, stream: MemoryStream) -> dict[str, Any]:
        other = f"{stream.queue}-other-dlq"
        self.queues[other] = MemoryQueue(self.lease_seconds_min)
        return {"dead_letter_queue": other}


class TestMemoryContract(SharedStreamContract, ShapeConflictContract):
    @pytest.fixture
    def contract_broker(self, monkeypatch: pytest.MonkeyPatch) -> Iterator[MemoryContractBroker]:
        connection = {"conn_type": "generic", "host": NAMESPACE, "password": "example-token"}
        monkeypatch.setenv("AIRFLOW_CONN_MEMORY_DEFAULT", json.dumps(connection))
        yield MemoryContractBroker()
        NAMESPACES.pop(NAMESPACE, None)
