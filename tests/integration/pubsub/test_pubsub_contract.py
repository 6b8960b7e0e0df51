"""
Pub/Sub passes the shared-stream contract (tests/integration/contract) against Google's emulator.

Pub/Sub has no API that counts a subscription's unacknowledged or leased messages (the service
reports backlog only through Cloud Monitoring; the emulator not at all, and its snapshots come
back empty). So the settled state the contract reads is what the emulator ACCEPTED: every
``pull``, ``acknowledge`` and ``modify_ack_deadline`` the stream makes goes through
:class:`RecordingClient`, which records a call only after the emulator answered it OK. A message
counts as remaining until an ``acknowledge`` of it succeeded, and as leased from a successful
pull until a successful nack, an acknowledge, or the end of its ack deadline. Dead letters are
read from the emulator itself (a subscription on the dead-letter topic).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import pytest

from airflow_shared_stream.pubsub.trigger import PubSubSharedStreamTrigger
from tests.integration.contract.base import (
    ContractBroker,
    DeliveryBudgetContract,
    LeasedQueueContract,
    OrderedLanesContract,
    SharedStreamContract,
)
from tests.integration.pubsub.recording import LEDGERS, Ledger, RecordingTrigger
from tests.support.pubsub_emulator import PubSubEmulator

pytestmark = pytest.mark.integration


@dataclass
class PubSubStream:
    topic: str
    subscription: str
    dead_letter_topic: str | None
    dead_letter_reader: str | None
    published: list[str] = field(default_factory=list)


class PubSubContractBroker(ContractBroker):
    lease_seconds_min = 10  # Pub/Sub's shortest ack deadline

    def __init__(self, pubsub: PubSubEmulator) -> None:
        self.pubsub = pubsub

    def create_stream(
        self,
        *,
        dead_letter: bool = True,
        lease_seconds: int = 30,
        ordered: bool = False,
        max_deliveries: int | None = None,
    ) -> PubSubStream:
        dead_topic = dead_reader = None
        if dead_letter or max_deliveries:
            dead_topic, dead_reader = self.pubsub.topic_with_subscription()
        policy: dict[str, Any] = {}
        if max_deliveries:
            policy = {"dead_letter_topic": dead_topic, "max_delivery_attempts": max_deliveries}
        topic, subscription = self.pubsub.topic_with_subscription(
            ack_deadline_seconds=max(self.lease_seconds_min, lease_seconds), ordering=ordered, **policy
        )
        LEDGERS[subscription] = Ledger(ack_deadline=max(self.lease_seconds_min, lease_seconds))
        return PubSubStream(topic, subscription, dead_topic, dead_reader)

    def publish(self, stream: PubSubStream, bodies: list[Any], *, lane: str | None = None) -> list[str]:
        ids = []
        for body in bodies:
            ids.extend(self.pubsub.publish(stream.topic, [body], ordering_key=lane))
        stream.published.extend(ids)
        return ids

    def message_id(self, payload: dict[str, Any]) -> str:
        return payload["message_id"]

    def attempts_spent(self, payload: dict[str, Any]) -> int:
        # Counted only on a subscription with a dead-letter policy (None without one).
        return (payload["delivery_attempt"] or 1) - 1

    def remaining(self, stream: PubSubStream) -> int:
        acked = LEDGERS[stream.subscription].acked
        return sum(1 for message_id in stream.published if message_id not in acked)

    def leased(self, stream: PubSubStream) -> int:
        return LEDGERS[stream.subscription].leased()

    def dead_letters(self, stream: PubSubStream) -> list[Any]:
        assert stream.dead_letter_reader is not None
        return [json.loads(m.message.data) for m in self.pubsub.pull(stream.dead_letter_reader)]

    def break_dead_letter(self, stream: PubSubStream) -> None:
        assert stream.dead_letter_topic is not None
        self.pubsub.publisher.delete_topic(topic=stream.dead_letter_topic)

    def trigger(self, stream: PubSubStream, **kwargs: Any) -> PubSubSharedStreamTrigger:
        return RecordingTrigger(stream.subscription, dead_letter_topic=stream.dead_letter_topic, **kwargs)


class TestPubSubContract(
    SharedStreamContract, OrderedLanesContract, DeliveryBudgetContract, LeasedQueueContract
):
    @pytest.fixture
    def contract_broker(self, pubsub) -> PubSubContractBroker:
        return PubSubContractBroker(pubsub)
