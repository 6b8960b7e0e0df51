"""
Pub/Sub redrive bound on Google's Pub/Sub emulator (issue 45 item 1).

Pub/Sub cannot count a subscription's backlog without Cloud Monitoring, so the snapshot is the
time the redrive started: a message published to the dead-letter topic after it (a copy a
watcher rejected again) is held and given back at the end, never chased.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from airflow_shared_stream.common.redrive import RedriveItem, redrive
from tests.integration.pubsub.test_pubsub_redrive import drain, setup, source
from tests.support.pubsub_emulator import PubSubEmulator


async def test_a_pubsub_redrive_never_chases_its_own_copies(pubsub: PubSubEmulator) -> None:
    origin, origin_sub, dead_sub, bodies = setup(pubsub, 6)
    dead_topic = pubsub.subscriber.get_subscription(subscription=dead_sub).topic

    async def rejected_again(step: str, items: Sequence[RedriveItem]) -> None:
        if step == "copied" and items:
            copies = [bytes(i.handle.message.data).decode() for i in items]
            await asyncio.to_thread(pubsub.publish, dead_topic, copies)

    summary = await redrive(
        source(pubsub, dead_sub, origin), max_messages=50, checkpoint=rejected_again, batch_size=2
    )

    assert summary.moved == 6  # not one copy chased
    assert sorted(m.message.data for m in await drain(pubsub, origin_sub, 6)) == sorted(bodies)
    assert len(await drain(pubsub, dead_sub, 6)) == 6  # the copies that came back: the next one's
    assert (summary.examined, summary.left) == (6, 0)
