"""
The reliability triggerer starts the watchers of a failed group again as Airflow's triggerer does.

Airflow's triggerer re-creates every trigger still assigned to it that is not running in one pass
of its loop, so the watchers of a shared-stream group that failed together (its producer raised)
subscribe again together. The reliability triggerer restarted them one at a time, ``restart_after``
apart: the first re-opened the stream and advanced it before the others were back, and they
missed what it advanced (core limit 2, a late re-join, in docs/concepts.rst). Seen in the Service
Bus ``broker_restart`` run of 2026-11-25 with 2,000 messages: one watcher of three never received
198 messages that the other two had persisted and settled.

The real manager and the in-memory leased queue; the producer's settlement fails once, as a
settlement does against a broker that went away.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Sequence
from typing import Any, ClassVar

from airflow_shared_stream.common.leased_queue import Delivery
from airflow_shared_stream.testing import InMemoryProducer, InMemoryTrigger
from tests.reliability.scenarios import read_records
from tests.reliability.triggerer import PERSISTED, PersistingTriggerer, TriggererSpec, WatcherSpec


class OutageProducer(InMemoryProducer):
    """
    Its first ACK batch fails (the broker is away); every later one goes through.

    What a real broker gives back when a lease runs out (the failed ACKs, what the failed group
    held unsettled) comes back here at once: memory has no leases.
    """

    failed_streams: ClassVar[set[str]] = set()

    async def ack(self, deliveries: Sequence[Delivery[int]]) -> None:
        if self.stream not in self.failed_streams:
            self.failed_streams.add(self.stream)
            await self.redeliver(deliveries)  # what the broker does once their leases run out
            raise ConnectionError("the broker went away")
        await super().ack(deliveries)

    async def release_unsettled(self, deliveries: Sequence[Delivery[int]]) -> None:
        await self.redeliver(deliveries)


class OutageTrigger(InMemoryTrigger):
    producer_class = OutageProducer


def watcher_spec(name: str, stream: str) -> WatcherSpec:
    classpath, kwargs = OutageTrigger(stream, max_in_flight=20).serialize()
    return WatcherSpec(name=name, classpath=classpath, kwargs=kwargs)


async def test_watchers_that_failed_together_are_started_again_together(tmp_path):
    stream = f"outage-{uuid.uuid4().hex[:8]}"
    queue = InMemoryProducer.queue(stream)
    for n in range(400):
        queue.publish({"n": n})
    names = ("first", "second", "third")
    spec = TriggererSpec(
        out_dir=str(tmp_path),
        watchers=[watcher_spec(name, stream) for name in names],
        sync_interval=0.02,
        restart_after=0.3,
    )
    triggerer = PersistingTriggerer(spec)
    await triggerer.start()
    try:
        for _ in range(200):
            seen: dict[str, set[Any]] = {name: set() for name in names}
            for record in read_records(tmp_path / PERSISTED):
                seen[record["w"]].add(record["n"])
            if all(len(numbers) == 400 for numbers in seen.values()):
                break
            await asyncio.sleep(0.05)
    finally:
        await triggerer.stop()
        InMemoryProducer.queues.pop(stream, None)
    assert triggerer.failures == 3, "every watcher of the group failed once, with its producer"
    missed = {name: 400 - len(numbers) for name, numbers in seen.items()}
    assert missed == dict.fromkeys(names, 0), f"messages a watcher never received: {missed}"
