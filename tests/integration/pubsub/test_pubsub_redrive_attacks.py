"""
Pub/Sub redrive, attacked after issue 45 (FAULT_MODEL classes 1 and 15), on Google's emulator.

Each test is a break found by an attacker who did not write the change; each is marked
``xfail(strict=True)`` until it is fixed (the fixer removes the mark).
"""

from __future__ import annotations

import json

import pytest

from airflow_shared_stream.common.redrive import redrive
from airflow_shared_stream.pubsub.dead_letter import DEAD_LETTER_ORIGIN_SUBSCRIPTION
from tests.integration.pubsub.test_pubsub_redrive import source
from tests.support.pubsub_emulator import PubSubEmulator
from tests.support.waiting import eventually

pytestmark = pytest.mark.integration


async def test_a_message_that_names_its_own_origin_is_never_redriven_into_another_topic(
    pubsub: PubSubEmulator,
) -> None:
    """
    FAULT_MODEL 1 and 15 (the origin's identity; routed home). Whoever may publish to stream A's
    topic adds the attribute ``dead_letter_origin_subscription`` naming stream B's subscription.
    A's subscription dead-letters it by its dead-letter policy, which stamps the true origin
    (``CloudPubSubDeadLetterSourceSubscription``) but leaves the forged attribute. The redrive
    reads ours first, so stream B's redrive publishes A's message into B's topic.
    """
    dead_topic, dead_sub = pubsub.topic_with_subscription()
    policy = {"dead_letter_topic": dead_topic, "max_delivery_attempts": 5}
    orders, orders_sub = pubsub.topic_with_subscription(**policy)
    payments, payments_sub = pubsub.topic_with_subscription(**policy)
    pubsub.publish(orders, [json.dumps({"n": 1})], attributes={DEAD_LETTER_ORIGIN_SUBSCRIPTION: payments_sub})
    forwarded: list[str] = []

    def nack_until_forwarded() -> int:
        for subscription in (orders_sub, dead_sub):
            received = pubsub.pull(subscription, ack=False)
            if subscription == dead_sub:
                forwarded.extend(m.message.message_id for m in received)
            if received:
                pubsub.subscriber.modify_ack_deadline(
                    subscription=subscription, ack_ids=[m.ack_id for m in received], ack_deadline_seconds=0
                )
        return len(forwarded)

    await eventually(nack_until_forwarded, lambda n: n >= 1, timeout=120, what="forwarded by the policy")

    summary = await redrive(source(pubsub, dead_sub, payments))  # stream B's redrive

    assert pubsub.pull(payments_sub) == []  # A's message never reaches B's topic
    assert (summary.moved, summary.left_untouched) == (0, 1)
