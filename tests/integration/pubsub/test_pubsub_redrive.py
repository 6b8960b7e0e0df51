"""
Dead-letter redrive on Google's Pub/Sub emulator.

The dead-letter topic carries messages as our dead-lettering publishes them (pubsub/dead_letter.py):
the original data, attributes and ordering key, plus our ``dead_letter_*`` attributes. The redrive
reads them through a subscription on that topic and publishes to the original topic, which a
subscription of its own lets the test read.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from typing import Any

import pytest

from airflow_shared_stream.common.redrive import RedriveConfigurationError, RedriveItem, redrive
from airflow_shared_stream.pubsub.dead_letter import DEAD_LETTER_ORIGIN_SUBSCRIPTION, DEAD_LETTER_REASON
from airflow_shared_stream.redrive import dead_letter_source
from tests.support.pubsub_emulator import PubSubEmulator
from tests.support.redrive_child import kill_between_copy_and_remove
from tests.support.waiting import eventually

OURS = {DEAD_LETTER_REASON: "rejected"}


def setup(pubsub: PubSubEmulator, count: int) -> tuple[str, str, str, list[bytes]]:
    """(origin topic, its subscription, dead-letter subscription, the bodies dead-lettered)."""
    origin, origin_sub = pubsub.topic_with_subscription(ordering=True)
    _, dead_sub = pubsub.topic_with_subscription()
    dead_topic = pubsub.subscriber.get_subscription(subscription=dead_sub).topic
    bodies = []
    for i in range(count):
        body = json.dumps({"n": i, "type": "a" if i % 2 else "b"})
        attributes = {"tenant": f"t{i}", **OURS, DEAD_LETTER_ORIGIN_SUBSCRIPTION: origin_sub}
        pubsub.publish(dead_topic, [body], ordering_key=f"k{i % 3}", attributes=attributes)
        bodies.append(body.encode())
    return origin, origin_sub, dead_sub, bodies


def source(pubsub: PubSubEmulator, dead_sub: str, origin: str, **kwargs: Any) -> Any:
    return dead_letter_source(
        "pubsub",
        source=origin,
        dead_letter=dead_sub,
        keep_origin_attributes=kwargs.pop("keep", False),
        broker_options={"lease_seconds": kwargs.pop("lease_seconds", 60)},
    )


async def drain(pubsub: PubSubEmulator, subscription: str, expected: int) -> list[Any]:
    got: list[Any] = []

    def pull() -> int:
        got.extend(pubsub.pull(subscription))
        return len(got)

    await eventually(
        pull, lambda n: n >= expected, timeout=60, what=f"{expected} message(s) on {subscription}"
    )
    return got


async def test_redrive_moves_every_message_with_attributes_and_ordering_key(pubsub: PubSubEmulator) -> None:
    origin, origin_sub, dead_sub, bodies = setup(pubsub, 9)

    summary = await redrive(source(pubsub, dead_sub, origin))

    assert (summary.moved, summary.skipped, summary.failed) == (9, 0, 0)
    moved = await drain(pubsub, origin_sub, 9)
    assert sorted(m.message.data for m in moved) == sorted(bodies)
    for received in moved:
        n = json.loads(received.message.data)["n"]
        assert dict(received.message.attributes) == {"tenant": f"t{n}"}
        assert received.message.ordering_key == f"k{n % 3}"
    assert pubsub.pull(dead_sub) == []


async def test_keep_origin_attributes_keeps_ours(pubsub: PubSubEmulator) -> None:
    origin, origin_sub, dead_sub, _ = setup(pubsub, 2)

    await redrive(source(pubsub, dead_sub, origin, keep=True))

    moved = await drain(pubsub, origin_sub, 2)
    assert all(m.message.attributes[DEAD_LETTER_REASON] == "rejected" for m in moved)


async def test_filter_moves_only_what_it_selects(pubsub: PubSubEmulator) -> None:
    origin, origin_sub, dead_sub, _ = setup(pubsub, 8)

    summary = await redrive(
        source(pubsub, dead_sub, origin), filter="body.type == 'a' && attributes.tenant != 't1'"
    )

    assert (summary.moved, summary.skipped) == (3, 5)
    assert sorted(json.loads(m.message.data)["n"] for m in await drain(pubsub, origin_sub, 3)) == [3, 5, 7]
    left = await drain(pubsub, dead_sub, 5)  # given back at once
    assert sorted(json.loads(m.message.data)["n"] for m in left) == [0, 1, 2, 4, 6]


async def test_max_messages_moves_no_more(pubsub: PubSubEmulator) -> None:
    origin, origin_sub, dead_sub, _ = setup(pubsub, 12)

    summary = await redrive(source(pubsub, dead_sub, origin), max_messages=4)

    assert summary.moved == 4
    assert len(await drain(pubsub, origin_sub, 4)) == 4
    assert len(await drain(pubsub, dead_sub, 8)) == 8
    assert pubsub.pull(origin_sub) == []


async def test_dry_run_changes_nothing(pubsub: PubSubEmulator) -> None:
    origin, origin_sub, dead_sub, bodies = setup(pubsub, 5)

    summary = await redrive(source(pubsub, dead_sub, origin), dry_run=True)

    assert (summary.moved, summary.dry_run) == (5, True)
    assert {json.dumps(s["body"]).encode() for s in summary.samples} == set(bodies)
    assert sorted(m.message.data for m in await drain(pubsub, dead_sub, 5)) == sorted(bodies)
    assert pubsub.pull(origin_sub) == []


async def test_a_redrive_killed_between_publish_and_ack_loses_nothing(pubsub: PubSubEmulator) -> None:
    origin, origin_sub, dead_sub, bodies = setup(pubsub, 25)

    line = await asyncio.to_thread(
        kill_between_copy_and_remove,
        "pubsub",
        source=origin,
        dead_letter=dead_sub,
        broker_options={"lease_seconds": 10},
    )

    copied = int(line.split()[1])
    assert copied > 0
    at_origin = {m.message.data for m in await drain(pubsub, origin_sub, copied)}
    in_dlq = {m.message.data for m in await drain(pubsub, dead_sub, len(bodies))}  # leases run out
    assert in_dlq == set(bodies)
    assert at_origin <= in_dlq


async def test_a_copy_pubsub_refuses_stays_in_the_dead_letter_subscription(pubsub: PubSubEmulator) -> None:
    """The original topic is deleted after the redrive read its batch: every publish is refused."""
    origin, _, dead_sub, bodies = setup(pubsub, 4)

    async def delete_the_origin(step: str, items: Sequence[RedriveItem]) -> None:
        if step == "read":
            await asyncio.to_thread(pubsub.publisher.delete_topic, topic=origin)

    summary = await redrive(source(pubsub, dead_sub, origin), checkpoint=delete_the_origin)

    assert (summary.moved, summary.failed) == (0, 4)
    assert sorted(m.message.data for m in await drain(pubsub, dead_sub, 4)) == sorted(bodies)


async def test_a_dead_letter_subscription_of_the_destination_topic_is_refused_once_open(
    pubsub: PubSubEmulator,
) -> None:
    """Which topic a subscription reads is known only from the broker: the engine asks once open."""
    origin, origin_sub = pubsub.topic_with_subscription()
    pubsub.publish(origin, [json.dumps({"n": 1})])

    with pytest.raises(RedriveConfigurationError, match="are one topic: every message moved would come"):
        await redrive(source(pubsub, origin_sub, origin), max_messages=5)  # bounded, were it to loop

    assert [m.message.data for m in await drain(pubsub, origin_sub, 1)] == [b'{"n": 1}']
