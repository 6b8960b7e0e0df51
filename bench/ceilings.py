"""
The in-memory anchors of bench/watchers.py: the manager's ceiling and the leased-queue template.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator, Hashable, Sequence
from typing import Any, ClassVar

from airflow.triggers.shared_stream import AdvanceItem, SharedStreamProducer

from airflow_shared_stream.common.flow_control import CreditWindow, yield_point
from airflow_shared_stream.common.matching import RawMessage, build_message
from airflow_shared_stream.common.settlement import decide
from airflow_shared_stream.common.trigger import DEFAULT_MAX_PAYLOAD_BYTES
from airflow_shared_stream.kafka.envelope import KafkaBrokerPayload
from airflow_shared_stream.testing import InMemoryProducer, InMemoryTrigger
from bench.harness import Cell, Meter, drive_shared


class CeilingProducer(SharedStreamProducer):
    """
    The smallest correct producer: what the manager's ceiling is measured with.

    Its messages are built before the cell (:func:`run_ceiling`), so per message it does only
    what the manager asks of any producer: take a credit of the window, yield, and give the
    subscribers a turn; ``advance`` decides each message's settlement and returns the credits.
    No broker, no decoding, no lease, no metric: a provider can approach this, not beat it.
    Yielding a whole window in one burst instead was slower at ten watchers (the subscribers'
    queues fill and drain in long runs) and no faster at one, so this is as fast as the manager
    allows.
    """

    messages: ClassVar[dict[str, list[RawMessage]]] = {}

    def __init__(self, *, stream: str, max_in_flight: int, **_shaping: Any) -> None:
        self.stream = stream
        self._window = CreditWindow(max_in_flight)

    async def open_stream(self) -> AsyncIterator[tuple[RawMessage, int]]:
        messages, number = self.messages[self.stream], 0
        window = self._window
        while number < len(messages):
            credits = await window.wait_for_credit()
            for message in messages[number : number + credits]:
                window.take()
                yield message, number
                number += 1
                await yield_point()
        await asyncio.Event().wait()  # the stream stays open, as a broker's would

    def get_advance_lane(self, broker_payload: int) -> Hashable:
        return self.stream

    async def advance(self, batch: Sequence[AdvanceItem]) -> None:
        for item in batch:
            decide(item.outcome)
        self._window.release(len(batch))


class CeilingTrigger(InMemoryTrigger):
    producer_class = CeilingProducer  # type: ignore[assignment]


class FreshCeilingProducer(CeilingProducer):
    """
    The ceiling with each message's envelope and raw event built as it is yielded.

    The bodies are decoded before the cell, as :class:`CeilingProducer`'s are, so per message
    this adds only what every producer must allocate: an envelope and a :class:`RawMessage`.
    Prebuilt messages sit in the collector's oldest generation for the whole cell (30,000 messages
    are 90,000 tracked objects, half again the heap of a bare triggerer), which puts the next full
    collection further off; a broker's messages are never there. So this one is the ceiling a
    provider is measured against on the collector's terms; :class:`CeilingProducer` is kept beside
    it for the earlier tables.
    """

    bodies: ClassVar[dict[str, list[dict[str, Any]]]] = {}

    async def open_stream(self) -> AsyncIterator[tuple[RawMessage, int]]:
        bodies, number = self.bodies[self.stream], 0
        window, stream = self._window, self.stream
        while number < len(bodies):
            credits = await window.wait_for_credit()
            for body in bodies[number : number + credits]:
                window.take()
                yield RawMessage({"body": body, "number": number}, f"{stream}#{number}"), number
                number += 1
                await yield_point()
        await asyncio.Event().wait()


class FreshCeilingTrigger(InMemoryTrigger):
    producer_class = FreshCeilingProducer  # type: ignore[assignment]


class KafkaPayloadCeilingProducer(FreshCeilingProducer):
    """
    The fresh ceiling with the Kafka producer's broker payload (a named tuple) instead of an int.

    A diagnosis, not a ceiling: the manager holds each message's payload until its persistence is
    confirmed, and an int is not tracked by the collector while a named tuple is (only exact
    tuples of untracked items leave its view), so this shows what the payload's type costs the
    collector with nothing else of Kafka's.
    """

    async def open_stream(self) -> AsyncIterator[tuple[RawMessage, Any]]:  # type: ignore[override]
        bodies, number = self.bodies[self.stream], 0
        window, stream = self._window, self.stream
        while number < len(bodies):
            credits = await window.wait_for_credit()
            for body in bodies[number : number + credits]:
                window.take()
                message = RawMessage({"body": body, "number": number}, f"{stream}#{number}")
                yield message, KafkaBrokerPayload(stream, 0, number, number)
                number += 1
                await yield_point()
        await asyncio.Event().wait()


class KafkaPayloadCeilingTrigger(InMemoryTrigger):
    producer_class = KafkaPayloadCeilingProducer  # type: ignore[assignment]


class BulkInMemoryProducer(InMemoryProducer):
    """The leased-queue template over memory; one receive takes every free credit, like a Kafka fetch."""

    receive_limit = None
    settle_batch_limit = None


class BulkInMemoryTrigger(InMemoryTrigger):
    producer_class = BulkInMemoryProducer


def _bodies(messages: int) -> list[dict[str, Any]]:
    return [{"n": n, "kind": "order", "pad": "x" * 60} for n in range(messages)]


async def run_ceiling(cell: Cell, budget: float, sync: float, meter: Meter | None = None) -> None:
    """The manager's ceiling: Airflow's manager and our filter, fed by :class:`CeilingProducer`."""
    stream = f"ceiling-{uuid.uuid4().hex[:8]}"
    CeilingProducer.messages[stream] = [
        build_message(
            json.dumps(body).encode(),
            metadata={"number": number},
            label=f"{stream}#{number}",
            max_payload_bytes=DEFAULT_MAX_PAYLOAD_BYTES,
        )
        for number, body in enumerate(_bodies(cell.messages))
    ]
    try:
        await drive_shared(lambda: CeilingTrigger(stream), cell, meter or Meter(None), budget, sync)
    finally:
        CeilingProducer.messages.pop(stream, None)


async def run_fresh_ceiling(cell: Cell, budget: float, sync: float, meter: Meter | None = None) -> None:
    """The ceiling of :class:`FreshCeilingProducer`: bodies decoded before, messages built when yielded."""
    stream = f"ceiling-fresh-{uuid.uuid4().hex[:8]}"
    FreshCeilingProducer.bodies[stream] = [json.loads(json.dumps(body)) for body in _bodies(cell.messages)]
    try:
        await drive_shared(lambda: FreshCeilingTrigger(stream), cell, meter or Meter(None), budget, sync)
    finally:
        FreshCeilingProducer.bodies.pop(stream, None)


async def run_kafka_payload_ceiling(
    cell: Cell, budget: float, sync: float, meter: Meter | None = None
) -> None:
    """The fresh ceiling yielding the Kafka producer's payload type (:class:`KafkaPayloadCeilingProducer`)."""
    stream = f"ceiling-kafka-payload-{uuid.uuid4().hex[:8]}"
    KafkaPayloadCeilingProducer.bodies[stream] = [
        json.loads(json.dumps(body)) for body in _bodies(cell.messages)
    ]
    try:
        await drive_shared(
            lambda: KafkaPayloadCeilingTrigger(stream), cell, meter or Meter(None), budget, sync
        )
    finally:
        KafkaPayloadCeilingProducer.bodies.pop(stream, None)


async def run_template(cell: Cell, budget: float, sync: float) -> None:
    """
    The leased-queue template over an in-memory queue (:class:`InMemoryProducer`), for reference.

    What SQS, Pub/Sub and Service Bus share, without a broker: its distance to the ceiling is
    the template's own cost per message. One receive takes every free credit, as a Kafka fetch
    or a Pub/Sub pull of the window would.
    """
    stream = f"template-{uuid.uuid4().hex[:8]}"
    queue = InMemoryProducer.queue(stream)
    for body in _bodies(cell.messages):
        queue.publish(json.dumps(body).encode())  # as the ceiling's bodies: the broker's bytes
    try:
        await drive_shared(lambda: BulkInMemoryTrigger(stream), cell, Meter(None), budget, sync)
    finally:
        InMemoryProducer.queues.pop(stream, None)
