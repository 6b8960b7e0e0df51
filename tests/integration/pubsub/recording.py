"""
What the emulator accepted, per subscription: the Pub/Sub suites' view of settled state.

Pub/Sub has no API that counts a subscription's unacknowledged or leased messages (the service
reports backlog only through Cloud Monitoring; the emulator not at all, and its snapshots come
back empty). :class:`RecordingTrigger` builds the real producer with a client that records each
``pull``, ``acknowledge`` and ``modify_ack_deadline`` only after the emulator answered it OK, so
a test can wait until the emulator has accepted an acknowledgement instead of sleeping.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

from airflow_shared_stream.pubsub.client import PubSubClient
from airflow_shared_stream.pubsub.producer import PubSubSharedStreamProducer
from airflow_shared_stream.pubsub.trigger import PubSubSharedStreamTrigger


@dataclass
class Ledger:
    """What the emulator accepted for one subscription."""

    ack_deadline: float
    acked: set[str] = field(default_factory=set)
    leases: dict[str, tuple[str, float]] = field(default_factory=dict)
    """ack id -> (message id, lease end)."""

    def leased(self) -> int:
        now = time.monotonic()
        return len({mid for mid, until in self.leases.values() if until > now and mid not in self.acked})


LEDGERS: dict[str, Ledger] = {}


class RecordingClient(PubSubClient):
    async def pull(self, subscription: str, max_messages: int, wait_seconds: float) -> Sequence[Any]:
        received = await super().pull(subscription, max_messages, wait_seconds)
        ledger = LEDGERS.setdefault(subscription, Ledger(ack_deadline=10))
        for r in received:
            ledger.leases[r.ack_id] = (r.message.message_id, time.monotonic() + ledger.ack_deadline)
        return received

    async def acknowledge(self, subscription: str, ack_ids: Sequence[str]) -> set[str]:
        refused = await super().acknowledge(subscription, ack_ids)
        ledger = LEDGERS.setdefault(subscription, Ledger(ack_deadline=10))
        for ack_id in ack_ids:
            if ack_id in ledger.leases and ack_id not in refused:
                ledger.acked.add(ledger.leases.pop(ack_id)[0])
        return refused

    async def modify_ack_deadline(self, subscription: str, ack_ids: Sequence[str], seconds: int) -> set[str]:
        refused = await super().modify_ack_deadline(subscription, ack_ids, seconds)
        ledger = LEDGERS.setdefault(subscription, Ledger(ack_deadline=10))
        for ack_id in ack_ids:
            if ack_id in ledger.leases and ack_id not in refused:
                message_id, _ = ledger.leases[ack_id]
                ledger.leases[ack_id] = (message_id, time.monotonic() + seconds)
        return refused


class RecordingProducer(PubSubSharedStreamProducer):
    client_class: ClassVar[type[PubSubClient]] = RecordingClient


class RecordingTrigger(PubSubSharedStreamTrigger):
    producer_class = RecordingProducer


def track(subscription: str, ack_deadline: float) -> Ledger:
    """Start recording what the emulator accepts for ``subscription``."""
    LEDGERS[subscription] = Ledger(ack_deadline=ack_deadline)
    return LEDGERS[subscription]
