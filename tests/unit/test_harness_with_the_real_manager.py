"""
The harness and the common trigger half, driven by Airflow's real SharedStreamManager.

The producer is the public in-memory leased queue (``airflow_shared_stream.testing``): these
tests are about the manager contract (binding, persistence gating, rejects, flow control), not
about a broker. The control experiment keeps its own deliberately unprotected producer.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Hashable, Sequence
from typing import Any, ClassVar

from airflow.triggers.shared_stream import AdvanceItem, SharedStreamProducer

from airflow_shared_stream.common.flow_control import CreditWindow, yield_point
from airflow_shared_stream.common.matching import RawMessage
from airflow_shared_stream.common.settlement import Settlement, decide
from airflow_shared_stream.common.trigger import SharedStreamTrigger
from airflow_shared_stream.testing import (
    InMemoryProducer,
    InMemoryQueue,
    InMemoryTrigger,
    SharedStreamHarness,
)


class MemoryBroker:
    """A list of messages and a record of how each was settled."""

    def __init__(self, messages: list[dict[str, Any]]) -> None:
        self.pending = list(messages)
        self.settled: dict[int, list[Settlement]] = {}
        self.max_in_flight_seen = 0


class MemoryProducer(SharedStreamProducer):
    broker: ClassVar[MemoryBroker]
    protect: ClassVar[bool] = True
    """Use the credit window and the yield point; off only for the overflow control test."""

    def __init__(self, max_in_flight: int) -> None:
        self.window = CreditWindow(max_in_flight)

    async def open_stream(self) -> AsyncIterator[tuple[RawMessage, int]]:
        n = 0
        while True:
            if not self.broker.pending:
                await asyncio.sleep(0.01)
                continue
            body = self.broker.pending.pop(0)
            if self.protect:
                await self.window.acquire()
            self.broker.max_in_flight_seen = max(self.broker.max_in_flight_seen, self.window.in_flight)
            unprocessable = "undecodable" if body.get("garbage") else None
            yield RawMessage({"n": n, "body": body}, f"m{n}", unprocessable), n
            n += 1
            if self.protect:
                await yield_point()

    async def advance(self, batch: Sequence[AdvanceItem]) -> None:
        for item in batch:
            self.broker.settled.setdefault(item.broker_payload, []).append(decide(item.outcome))
        self.window.release(len(batch))


class MemoryTrigger(SharedStreamTrigger):
    def __init__(self, *, name: str = "stream", **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.name = name

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return f"{__name__}.MemoryTrigger", {"name": self.name, **self._common_kwargs()}

    def shared_stream_key(self) -> Hashable:
        return ("memory", self.name)

    @classmethod
    def create_shared_stream_producer(cls, kwargs: dict[str, Any]) -> MemoryProducer:
        return MemoryProducer(kwargs["max_in_flight"])


async def settled(stream: str, count: int) -> InMemoryQueue:
    queue = InMemoryProducer.queue(stream)
    for _ in range(250):
        if len(queue.settled) >= count:
            break
        await asyncio.sleep(0.02)
    return queue


async def test_matches_fire_skips_ack_rejects_dead_letter():
    InMemoryProducer.reset()
    queue = InMemoryProducer.queue("orders")
    for body in ({"k": "a"}, {"k": "b"}, {"k": "bad"}, b"\xff\xfe not text", "x" * 2000):
        queue.publish(body)
    async with SharedStreamHarness(confirm_after=0.0) as harness:
        watcher = harness.add(
            InMemoryTrigger("orders", match="body.k == 'a'", reject="body.k == 'bad'", max_payload_bytes=1000)
        )
        await watcher.wait_for_events(1)
        await settled("orders", 5)
    assert [p["body"] for p in watcher.payloads] == [{"k": "a"}]
    assert queue.settled == {
        0: [Settlement.ACK],
        1: [Settlement.ACK],  # skipped by the filter: resolves cleanly
        2: [Settlement.DEAD_LETTER],
        3: [Settlement.ACK],  # binary: base64 in the envelope, matched against like any body
        4: [Settlement.DEAD_LETTER],  # over max_payload_bytes: unprocessable
    }
    reasons = {number: (reason, description) for number, reason, description in queue.dead_letters}
    assert reasons[2][0] == "rejected"
    assert "body.k == 'bad'" in reasons[2][1]
    assert "trigger 1" in reasons[2][1]  # which watcher rejected it
    assert reasons[4][0] == "unprocessable"
    assert "max_payload_bytes" in reasons[4][1]


async def test_nothing_settles_before_persistence_is_confirmed():
    InMemoryProducer.reset()
    queue = InMemoryProducer.queue("orders")
    for i in range(3):
        queue.publish({"k": i})
    async with SharedStreamHarness(confirm_after=None) as harness:
        watcher = harness.add(InMemoryTrigger("orders"))
        await watcher.wait_for_events(3)
        await asyncio.sleep(0.1)
        assert queue.settled == {}
        harness.confirm()
        await settled("orders", 3)
    assert queue.settled == {i: [Settlement.ACK] for i in range(3)}


async def test_the_credit_window_prevents_subscriber_overflow_on_a_burst():
    """Without the window, 2,000 buffered messages would overflow 64-slot subscriber queues."""
    InMemoryProducer.reset()
    queue = InMemoryProducer.queue("burst")
    for i in range(2000):
        queue.publish({"k": i})
    async with SharedStreamHarness(confirm_after=0.05, max_subscriber_queue=64) as harness:
        watchers = [harness.add(InMemoryTrigger("burst", max_in_flight=50)) for _ in range(5)]
        for watcher in watchers:
            await watcher.wait_for_events(2000, timeout=120)
    assert all(w.error is None for w in watchers)
    assert queue.max_in_flight_seen <= 50


async def test_without_flow_control_the_same_burst_overflows(monkeypatch):
    """The control for the test above: it can fail, because an unprotected producer overflows."""
    MemoryProducer.broker = MemoryBroker([{"k": i} for i in range(2000)])
    monkeypatch.setattr(MemoryProducer, "protect", False)
    async with SharedStreamHarness(confirm_after=0.05, max_subscriber_queue=64) as harness:
        watchers = [harness.add(MemoryTrigger(max_in_flight=50)) for _ in range(5)]
        errors = [await w.wait_for_error(timeout=30) for w in watchers]
    assert {type(e).__name__ for e in errors} == {"_SubscriberOverflow"}
