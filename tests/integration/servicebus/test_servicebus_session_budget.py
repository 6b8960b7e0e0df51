"""
A session message no watcher has seen spends no ``MaxDeliveryCount`` attempt (FAULT_MODEL class 4).

Service Bus counts a delivery of a session message when its session lock runs out (every message
locked on the link, prefetched ones included) and when it is abandoned; it does not count one
when the session receiver is closed with the message unsettled. Each test names the row of
``FIDELITY.md`` (the shared table of where the test server and the service differ) it rests on.
The entities here allow one or two deliveries, so a single count dead-letters or shows.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from typing import Any

import pytest
from airflow.triggers.shared_stream import AdvanceItem, AdvanceOutcome

from airflow_shared_stream.servicebus import ServiceBusSharedStreamProducer
from tests.support.waiting import eventually

pytestmark = pytest.mark.integration

ACKED = AdvanceOutcome(acked=1, failed=0, rejected=0)
FAILED = AdvanceOutcome(acked=0, failed=1, rejected=0)
NOBODY = AdvanceOutcome(acked=0, failed=0, rejected=0)
LOCK_SECONDS = 5
"""Service Bus's shortest lock duration."""


def session_producer(
    queue: str, connection: str, *, max_in_flight: int, max_concurrent_sessions: int
) -> ServiceBusSharedStreamProducer:
    return ServiceBusSharedStreamProducer(
        queue_name=queue,
        azure_service_bus_conn_id=connection,
        max_in_flight=max_in_flight,
        max_wait_time=1,
        session_enabled=True,
        max_concurrent_sessions=max_concurrent_sessions,
    )


def body(raw: Any) -> dict[str, Any]:
    value = raw.envelope["body"]
    return value if isinstance(value, dict) else json.loads(value)


async def next_unless_dead_lettered(stream: Any, servicebus, queue: str, timeout: float = 60) -> Any:
    """The stream's next item, or ``None`` once the entity dead-lettered something (it may never come)."""
    item = asyncio.ensure_future(anext(stream))
    deadline = asyncio.get_running_loop().time() + timeout
    while not item.done():
        await asyncio.wait([item], timeout=0.5)
        if not item.done() and servicebus.dead_letters(queue):
            item.cancel()
            await asyncio.gather(item, return_exceptions=True)
            return None
        assert asyncio.get_running_loop().time() < deadline, "the stream handed out nothing"
    return item.result()


async def fill_the_window_with_a(
    stream: Any, producer: ServiceBusSharedStreamProducer, servicebus, queue: str
) -> tuple[list[Any], int, int]:
    """
    Settle messages as they are handed out until two of session a's fill the window of two while
    session b's receiver holds a message prefetched, none of b's in flight (sessions are read in
    turn, so either may get a free credit). Returns a's deliveries in flight and how many of a's
    and of b's were settled.
    """
    in_flight: list[Any] = []
    settled = {"a": 0, "b": 0}

    def b_prefetched() -> bool:
        return any(m.session_id == "b" and m.lock_token for m in servicebus.messages(queue))

    while True:
        if len(in_flight) == 2:
            with contextlib.suppress(AssertionError):
                await eventually(b_prefetched, bool, timeout=3, what="session b prefetching")
                return in_flight, settled["a"], settled["b"]
            await producer.advance([AdvanceItem(in_flight.pop(0), ACKED)])
            settled["a"] += 1
        raw, payload = await asyncio.wait_for(anext(stream), 30)
        if body(raw)["s"] == "b":
            await producer.advance([AdvanceItem(payload, ACKED)])
            settled["b"] += 1
        else:
            in_flight.append(payload)


def dead_letter_reasons(servicebus, queue: str) -> list[str | None]:
    return [m.application_properties.get("DeadLetterReason") for m in servicebus.dead_letters(queue)]


async def test_a_session_held_behind_a_full_window_keeps_its_lock(servicebus, servicebus_connection):
    """
    Issue 47, item 1. FIDELITY rows "Service Bus session lock expiry" (+1 on every message locked
    on the link; the test server expires the lock whatever credit the link has, as the service
    team describes it) and "Service Bus lock expiry, prefetched messages included".

    Two sessions, a window of two, each session receiver prefetching. Session b's messages
    handed out are settled while its receiver holds the next one prefetched; a's messages then fill the
    window and stay in flight (persistence stopped). b's lock was renewed only through its
    deliveries in flight: it lapsed after the lock duration, and b2, which no watcher ever saw,
    was dead-lettered ``MaxDeliveryCountExceeded``. Every session the stream holds keeps its lock.
    """
    queue = servicebus.create_queue(requires_session=True, lock_duration=LOCK_SECONDS, max_delivery_count=1)
    servicebus.send(queue, [{"s": "a", "n": n} for n in range(8)], session_id="a")
    servicebus.send(queue, [{"s": "b", "n": n} for n in range(8)], session_id="b")
    producer = session_producer(queue, servicebus_connection, max_in_flight=2, max_concurrent_sessions=2)
    stream = producer.open_stream()
    try:
        (a1, a2), a_settled, b_settled = await fill_the_window_with_a(stream, producer, servicebus, queue)
        held = await eventually(
            lambda: [m for m in servicebus.messages(queue) if m.session_id == "b" and m.lock_token],
            bool,
            timeout=30,
            what="session b's receiver prefetching b2",
        )
        assert [m.delivery_count for m in held] == [0]
        # The window stays full for longer than the lock: b's lock is renewed past its first
        # expiry, or it lapses and b2 is dead-lettered.
        renewals_past_the_lock = 4
        # The server is shared by the session's tests: its counters are read from here on.
        expired_before = servicebus.expired_session_locks
        renewed_before = servicebus.session_lock_renewals["b"]
        await eventually(
            lambda: (
                servicebus.session_lock_renewals["b"] - renewed_before,
                servicebus.expired_session_locks - expired_before,
                len(servicebus.dead_letters(queue)),
            ),
            lambda seen: seen[0] >= renewals_past_the_lock or seen[1] > 0 or seen[2] > 0,
            timeout=60,
            what=f"session b renewed {renewals_past_the_lock} times, or its lock lapsing",
        )
        assert dead_letter_reasons(servicebus, queue) == [], "a message no watcher saw was dead-lettered"
        assert servicebus.expired_session_locks == expired_before
        await producer.advance([AdvanceItem(a1, ACKED), AdvanceItem(a2, ACKED)])
        rest = []
        while len(rest) < 16 - 2 - a_settled - b_settled:
            raw, payload = await asyncio.wait_for(anext(stream), 30)
            rest.append(raw)
            await producer.advance([AdvanceItem(payload, ACKED)])
        await eventually(lambda: servicebus.messages(queue), lambda m: m == [], timeout=30, what="completed")
    finally:
        await stream.aclose()
        await producer.aclose()
    assert {(body(raw)["s"], raw.envelope["delivery_count"]) for raw in rest} == {("a", 0), ("b", 0)}
    assert dead_letter_reasons(servicebus, queue) == []


async def test_held_session_messages_given_back_past_the_bound_spend_no_attempt(
    servicebus, servicebus_connection
):
    """
    Issue 47, item 2. FIDELITY row "Service Bus session receiver closed with unsettled messages"
    (back, count unchanged; azure-sdk-for-js tracker) against "Service Bus ``modified``
    (abandon)" (+1).

    A session message that reached nobody is held, then given back once held past the bound.
    The give-back abandoned session messages (the ``released`` path skips them): each round
    counted one delivery, and the entity dead-lettered the message, unseen, after its
    ``MaxDeliveryCount`` rounds. Giving the session up (closing its receiver) returns it uncounted.
    """
    rounds = 3
    queue = servicebus.create_queue(requires_session=True, lock_duration=LOCK_SECONDS, max_delivery_count=2)
    servicebus.send(queue, [{"s": "g", "n": 1}, {"s": "g", "n": 2}], session_id="g")
    producer = session_producer(queue, servicebus_connection, max_in_flight=10, max_concurrent_sessions=1)
    producer.unseen_hold_seconds = 0.5
    stream = producer.open_stream()
    leases: set[str] = set()
    counts: list[int] = []
    try:
        while len(leases) < 2 * rounds:
            received = await next_unless_dead_lettered(stream, servicebus, queue)
            if received is None:
                break
            raw, payload = received
            leases.add(str(payload.delivery.lease))  # a new lock token: the broker handed it out again
            counts.append(raw.envelope["delivery_count"])
            await producer.advance([AdvanceItem(payload, NOBODY)])
    finally:
        await stream.aclose()
        await producer.aclose()
    assert dead_letter_reasons(servicebus, queue) == [], "session messages no watcher saw were dead-lettered"
    assert set(counts) == {0}, f"delivery counts spent while nobody saw the messages: {counts}"


async def test_a_message_held_back_behind_its_sessions_redelivery_spends_no_attempt(
    servicebus, servicebus_connection
):
    """
    FIDELITY rows "Service Bus ``modified`` (abandon)" (+1) and "Service Bus session receiver
    closed with unsettled messages" (count unchanged).

    1 and 2 of a session arrive in one receive; 1 is handed out and fails before 2 is. 2, later
    in the session than the redelivered 1, is held back instead of handed out: it was abandoned,
    spending an attempt of a message no watcher saw. The session is given up after an abandon
    anyway (closing its receiver returns 2 uncounted, behind 1).
    """
    queue = servicebus.create_queue(requires_session=True, lock_duration=30, max_delivery_count=3)
    servicebus.send(queue, [{"s": "g", "n": 1}, {"s": "g", "n": 2}], session_id="g")
    producer = session_producer(queue, servicebus_connection, max_in_flight=10, max_concurrent_sessions=1)
    stream = producer.open_stream()
    again: list[Any] = []
    try:
        raw, payload = await asyncio.wait_for(anext(stream), 30)
        assert body(raw)["n"] == 1
        # 2 was received with 1 and waits in the stream, not yet handed out.
        assert len(producer.held_deliveries()) == 2
        await producer.advance([AdvanceItem(payload, FAILED)])
        while len(again) < 2:
            raw, payload = await asyncio.wait_for(anext(stream), 30)
            again.append(raw)
            await producer.advance([AdvanceItem(payload, ACKED)])
        await eventually(lambda: servicebus.messages(queue), lambda m: m == [], timeout=30, what="completed")
    finally:
        await stream.aclose()
        await producer.aclose()
    assert [(body(raw)["n"], raw.envelope["delivery_count"]) for raw in again] == [(1, 1), (2, 0)]
