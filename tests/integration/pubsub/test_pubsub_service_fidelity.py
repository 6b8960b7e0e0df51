"""
Pub/Sub's delivery budgets on the stand-in that behaves like the service (tests/support/pubsub_service.py).

Google's emulator stalls an ordering key after a nack, and accepts any ack id; Pub/Sub hands a
nacked key out again at once and, on an exactly-once subscription, refuses an expired ack id.
What rests on those rows of FIDELITY.md is tested here, against the service's documented behaviour.
"""

from __future__ import annotations

import logging

import pytest

from tests.integration.contract.delivery_budget import DeliveryBudgetContract, OrderedDeliveryBudgetContract
from tests.integration.pubsub.broker import PubSubContractBroker

pytestmark = pytest.mark.integration


class TestPubSubServiceDeliveryBudget(OrderedDeliveryBudgetContract, DeliveryBudgetContract):
    """
    FIDELITY.md rows "Pub/Sub ordering key after a nack" (the nacked message and the later ones
    of its key come back at once) and "Pub/Sub attempts with a dead-letter policy" (counted per
    delivery, forwarded past the limit): an ordered lane nobody saw is held, never nacked round
    after round, so the policy's attempts are not spent in seconds.
    """

    @pytest.fixture
    def contract_broker(self, pubsub_service) -> PubSubContractBroker:
        return PubSubContractBroker(pubsub_service)


async def test_an_exactly_once_subscription_refusing_an_expired_ack_id_redelivers_without_failing(
    pubsub_service, caplog
):
    """
    FIDELITY.md row "Pub/Sub exactly-once": the service refuses an acknowledgement (or an
    extension) of an ack id whose deadline passed, naming it in an ``ErrorInfo``; the emulator
    accepts any ack id. A lease that lapses while its event waits for persistence (a stalled
    renewal) is a redelivery: the watcher sees the message again, the refused ack is logged, the
    redelivered copy is acknowledged, and the stream goes on. Never a failed stream.
    """
    from google.pubsub_v1 import Subscription

    from airflow_shared_stream.testing import SharedStreamHarness
    from tests.integration.pubsub.recording import RecordingTrigger, track
    from tests.support.pubsub_service import expire_leases
    from tests.support.waiting import eventually

    topic = pubsub_service.create_topic()
    subscription = pubsub_service.subscription_path("exactly-once-" + topic.rsplit("-", 1)[1])
    pubsub_service.subscriber.create_subscription(
        request=Subscription(
            name=subscription, topic=topic, ack_deadline_seconds=10, enable_exactly_once_delivery=True
        )
    )
    ledger = track(subscription, ack_deadline=10)
    caplog.set_level(logging.WARNING, logger="airflow_shared_stream")
    async with SharedStreamHarness(confirm_after=None) as harness:
        watcher = harness.add(RecordingTrigger(subscription))
        [first] = pubsub_service.publish(topic, [{"n": 1}])
        await watcher.wait_for_events(1, timeout=60)
        expire_leases(pubsub_service.host, subscription)  # its lease lapses before it is persisted
        await watcher.wait_for_events(2, timeout=60)  # handed out again, under a new ack id
        harness.confirm()
        await eventually(lambda: ledger.acked, lambda acked: first in acked, timeout=60, what="acked")
        [second] = pubsub_service.publish(topic, [{"n": 2}])
        await eventually(
            lambda: (harness.confirm(), ledger.acked)[1],
            lambda acked: second in acked,
            timeout=60,
            what="the stream going on",
        )
        assert watcher.error is None, watcher.error
    ids = [p["message_id"] for p in watcher.payloads]
    assert ids.count(first) >= 2, ids
    assert second in ids, ids
    refused = [r.getMessage() for r in caplog.records if "refused" in r.getMessage()]
    assert refused, "the expired ack id was not refused: the stand-in is not behaving like the service"
