"""
Where a Pub/Sub redrive publishes, on Google's emulator: a dead-letter topic shared by two
streams sends each message home or leaves it, and a cut copy is never published as the original
(docs/redrive.rst).
"""

from __future__ import annotations

import json
import logging

import pytest

from airflow_shared_stream.common.redrive import redrive
from airflow_shared_stream.pubsub.dead_letter import (
    DEAD_LETTER_ORIGIN_SUBSCRIPTION,
    DEAD_LETTER_REASON,
    DEAD_LETTER_TRUNCATED_FROM,
)
from tests.integration.pubsub.test_pubsub_redrive import drain, source
from tests.support.pubsub_emulator import PubSubEmulator
from tests.support.waiting import eventually


def dead_letter(
    pubsub: PubSubEmulator, dead_topic: str, origin_sub: str, ns: list[int], **extra: str
) -> None:
    """Messages on the dead-letter topic as our dead-lettering of ``origin_sub`` publishes them."""
    attributes = {DEAD_LETTER_REASON: "rejected", DEAD_LETTER_ORIGIN_SUBSCRIPTION: origin_sub, **extra}
    pubsub.publish(dead_topic, [json.dumps({"n": n}) for n in ns], attributes=attributes)


async def test_a_dead_letter_topic_shared_by_two_streams_sends_each_message_home(
    pubsub: PubSubEmulator,
) -> None:
    orders, orders_sub = pubsub.topic_with_subscription()
    payments, payments_sub = pubsub.topic_with_subscription()
    dead_topic, dead_sub = pubsub.topic_with_subscription()
    dead_letter(pubsub, dead_topic, orders_sub, [1, 2, 3])
    dead_letter(pubsub, dead_topic, payments_sub, [10, 11])

    summary = await redrive(source(pubsub, dead_sub, orders))

    assert sorted(json.loads(m.message.data)["n"] for m in await drain(pubsub, orders_sub, 3)) == [1, 2, 3]
    assert pubsub.pull(payments_sub) == []
    assert (summary.moved, summary.left_untouched) == (3, 2)

    summary = await redrive(source(pubsub, dead_sub, payments))  # what was left is still there

    assert sorted(json.loads(m.message.data)["n"] for m in await drain(pubsub, payments_sub, 2)) == [10, 11]
    assert summary.moved == 2


async def test_a_truncated_dead_letter_is_never_published_as_the_original(
    pubsub: PubSubEmulator, caplog: pytest.LogCaptureFixture
) -> None:
    origin, origin_sub = pubsub.topic_with_subscription()
    dead_topic, dead_sub = pubsub.topic_with_subscription()
    dead_letter(pubsub, dead_topic, origin_sub, [0], **{DEAD_LETTER_TRUNCATED_FROM: "10485760"})

    with caplog.at_level(logging.WARNING):
        summary = await redrive(source(pubsub, dead_sub, origin))

    assert pubsub.pull(origin_sub) == []
    assert (summary.moved, summary.left_untouched) == (0, 1)
    assert "recover the message from its publisher" in caplog.text
    assert len(await drain(pubsub, dead_sub, 1)) == 1  # given back, still there


async def test_the_dead_letter_policy_s_own_dead_letters_go_home_by_its_stamp(pubsub: PubSubEmulator) -> None:
    """Pub/Sub forwards after ``max_delivery_attempts`` and writes where from: two streams, one topic."""
    dead_topic, dead_sub = pubsub.topic_with_subscription()
    policy = {"dead_letter_topic": dead_topic, "max_delivery_attempts": 5}
    orders, orders_sub = pubsub.topic_with_subscription(**policy)
    _, payments_sub = pubsub.topic_with_subscription(**policy)
    pubsub.publish(orders, [json.dumps({"n": 1})])
    pubsub.publish(
        pubsub.subscriber.get_subscription(subscription=payments_sub).topic, [json.dumps({"n": 10})]
    )
    forwarded: dict[str, object] = {}

    def nack_until_forwarded() -> int:
        for subscription in (orders_sub, payments_sub, dead_sub):
            received = pubsub.pull(subscription, ack=False)
            if subscription == dead_sub:
                forwarded.update((m.message.message_id, dict(m.message.attributes)) for m in received)
            if received:
                pubsub.subscriber.modify_ack_deadline(
                    subscription=subscription, ack_ids=[m.ack_id for m in received], ack_deadline_seconds=0
                )
        return len(forwarded)

    await eventually(nack_until_forwarded, lambda n: n == 2, timeout=120, what="both forwarded by the policy")

    summary = await redrive(source(pubsub, dead_sub, orders))

    assert [json.loads(m.message.data)["n"] for m in await drain(pubsub, orders_sub, 1)] == [1], forwarded
    assert (summary.moved, summary.left_untouched) == (1, 1), forwarded
