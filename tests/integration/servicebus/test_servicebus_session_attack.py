"""
Attacks on session locks and give-backs (issue 47 items 1-3): FAULT_MODEL classes 4, 5 and 9.

Each test names the row of ``FIDELITY.md`` it rests on.
"""

from __future__ import annotations

import asyncio
import itertools
from typing import Any

import pytest
from airflow.triggers.shared_stream import AdvanceItem

from tests.integration.servicebus.test_servicebus_session_budget import (
    ACKED,
    FAILED,
    body,
    dead_letter_reasons,
    fill_the_window_with_a,
    session_producer,
)
from tests.support.waiting import eventually

pytestmark = pytest.mark.integration


async def test_a_session_given_up_while_its_lock_renewal_is_in_flight_stays_given_up(
    servicebus, servicebus_connection
):
    """
    FAULT_MODEL classes 4 and 5: a session whose receiver is closed while a renewal of its lock
    is in flight. FIDELITY rows "Service Bus session receiver closed with unsettled messages"
    (back, count unchanged) and "Service Bus session lock expiry" (+1 on every message locked
    on the link).

    The session's lock renewal is answered slowly (the server holds it for a while, as a slow
    network would). Meanwhile a message of the session fails, and the session is given up (its
    receiver closed). A renewal cut off by the close must not open the receiver again (the
    SDK's retries re-open a closed handler): an orphan would hold the session until its lock
    ran out, and the service would count every message it prefetched. Held on azure-servicebus
    7.15: the cut-off request fails ``Management Operation error``, which the SDK does not retry.
    """
    queue = servicebus.create_queue(requires_session=True, lock_duration=5, max_delivery_count=2)
    servicebus.send(queue, [{"s": "g", "n": n} for n in (1, 2, 3)], session_id="g")
    producer = session_producer(queue, servicebus_connection, max_in_flight=6, max_concurrent_sessions=1)
    servicebus.session_renewal_delay = {"g": 2.0}
    stream = producer.open_stream()
    again: list[Any] = []
    try:
        raw, payload = await asyncio.wait_for(anext(stream), 30)
        assert body(raw)["n"] == 1
        # Wait for a renewal of g's lock to be in flight (held by the server), then fail g1.
        await eventually(
            lambda: len(servicebus._handler.delayed), bool, timeout=30, what="a renewal of g's lock in flight"
        )
        await producer.advance([AdvanceItem(payload, FAILED)])
        expired_before = servicebus.expired_session_locks
        while len(again) < 3:
            raw, payload = await asyncio.wait_for(anext(stream), 60)
            again.append(raw)
            await producer.advance([AdvanceItem(payload, ACKED)])
        await eventually(lambda: servicebus.messages(queue), lambda m: m == [], timeout=30, what="completed")
    finally:
        servicebus.session_renewal_delay = {}
        await stream.aclose()
        await producer.aclose()
    assert dead_letter_reasons(servicebus, queue) == []
    assert servicebus.expired_session_locks == expired_before, (
        "an orphaned receiver held the session until its lock ran out"
    )
    assert [(body(r)["n"], r.envelope["delivery_count"]) for r in again] == [(1, 1), (2, 0), (3, 0)]


async def test_one_sessions_slow_lock_renewal_does_not_starve_the_others(servicebus, servicebus_connection):
    """
    FAULT_MODEL classes 4 and 5 (renewals bounded, concurrent where the SDK allows). FIDELITY
    rows "Service Bus session lock expiry" (+1 on every message locked on the link) and
    "Service Bus lock expiry, prefetched messages included".

    Each session receiver has a connection of its own; a renewal on one of them can hang (a
    stalled connection, a slow answer). The sessions' lock keeper renewed every due session
    together and waited for all of them, with no timeout: while session a's renewal hung, b's
    lock was renewed by nobody, lapsed, and b2, prefetched and seen by no watcher, was
    dead-lettered ``MaxDeliveryCountExceeded``.
    """
    lock = 6
    queue = servicebus.create_queue(requires_session=True, lock_duration=lock, max_delivery_count=1)
    servicebus.send(queue, [{"s": "a", "n": n} for n in range(8)], session_id="a")
    servicebus.send(queue, [{"s": "b", "n": n} for n in range(8)], session_id="b")
    producer = session_producer(queue, servicebus_connection, max_in_flight=2, max_concurrent_sessions=2)
    stream = producer.open_stream()
    try:
        await fill_the_window_with_a(stream, producer, servicebus, queue)
        await eventually(
            lambda: [m for m in servicebus.messages(queue) if m.session_id == "b" and m.lock_token],
            bool,
            timeout=30,
            what="session b's receiver prefetching b2",
        )
        # Session a's connection stalls: its lock renewals are answered after 20 s (its lock
        # lapses meanwhile: a's messages in flight come back, counted, as they would).
        servicebus.session_renewal_delay = {"a": 20.0}
        renewed = servicebus.session_lock_renewed_at["b"]
        renewed_before = len(renewed)
        await eventually(
            lambda: (
                len(renewed) - renewed_before,
                [m for m in servicebus.dead_letters(queue) if m.session_id == "b"],
            ),
            lambda seen: seen[0] >= 6 or seen[1],
            timeout=60,
            what="session b renewed 6 times, or its prefetched message dead-lettered",
        )
        assert [m.session_id for m in servicebus.dead_letters(queue) if m.session_id == "b"] == [], (
            "b2, seen by no watcher, was dead-lettered while a's renewal hung"
        )
        times = renewed[max(0, renewed_before - 1) :]
        gaps = [later - earlier for earlier, later in itertools.pairwise(times)]
        # Renewed within a third of what its lock has left (2 s here), never waiting on a's.
        assert max(gaps) < lock / 2, f"session b's lock went {max(gaps):.1f} s unrenewed behind a's: {gaps}"
    finally:
        servicebus.session_renewal_delay = {}
        await stream.aclose()
        await producer.aclose()


async def test_a_session_behind_a_busy_one_is_served_with_few_credits(servicebus, servicebus_connection):
    """
    FAULT_MODEL classes 4 and 7 (the fairness gap the authors named): sessions are read in a
    fixed order, and reading stops when the free credits run out. With one free credit and two
    sessions, the first session's receive takes the credit every time while it has messages:
    the second session's message, held (prefetched) under a lock the stream keeps renewing, is
    handed out only once the first session is empty. Behind a session that keeps receiving, it
    is never handed out, and no other consumer can take the session meanwhile.
    """
    queue = servicebus.create_queue(requires_session=True, lock_duration=30, max_delivery_count=3)
    busy = 12
    servicebus.send(queue, [{"s": "a", "n": n} for n in range(busy)], session_id="a")
    servicebus.send(queue, [{"s": "b", "n": 0}], session_id="b")
    producer = session_producer(queue, servicebus_connection, max_in_flight=1, max_concurrent_sessions=2)
    stream = producer.open_stream()
    order: list[str] = []
    try:
        while "b" not in order:
            raw, payload = await asyncio.wait_for(anext(stream), 30)
            order.append(body(raw)["s"])
            await producer.advance([AdvanceItem(payload, ACKED)])
    finally:
        await stream.aclose()
        await producer.aclose()
    assert order.index("b") < 4, f"session b waited behind {order.index('b')} messages of session a"


async def test_a_stream_closed_while_it_holds_sessions_spends_no_attempt_and_keeps_their_order(
    servicebus, servicebus_connection
):
    """
    FAULT_MODEL classes 4 and 9: a stream that closes while sessions are held (more sessions
    than it may hold, fewer credits than sessions), with messages handed out and not advanced
    and others prefetched. FIDELITY row "Service Bus session receiver closed with unsettled
    messages" (back, count unchanged). The next stream gets every message with its delivery
    count unchanged (``MaxDeliveryCount`` 1: a count would dead-letter it), each session in order.
    """
    queue = servicebus.create_queue(requires_session=True, lock_duration=5, max_delivery_count=1)
    for session in "xyz":
        servicebus.send(queue, [{"s": session, "n": n} for n in range(3)], session_id=session)
    first = session_producer(queue, servicebus_connection, max_in_flight=2, max_concurrent_sessions=2)
    stream = first.open_stream()
    try:
        for _ in range(2):
            await asyncio.wait_for(anext(stream), 30)  # handed out, never advanced
    finally:
        await stream.aclose()
        await first.aclose()
    second = session_producer(queue, servicebus_connection, max_in_flight=2, max_concurrent_sessions=2)
    stream = second.open_stream()
    seen: list[tuple[str, int, int]] = []
    try:
        while len(seen) < 9:
            raw, payload = await asyncio.wait_for(anext(stream), 60)
            seen.append((body(raw)["s"], body(raw)["n"], raw.envelope["delivery_count"]))
            await second.advance([AdvanceItem(payload, ACKED)])
    finally:
        await stream.aclose()
        await second.aclose()
    assert dead_letter_reasons(servicebus, queue) == []
    assert [count for _, _, count in seen] == [0] * 9
    for session in "xyz":
        assert [n for s, n, _ in seen if s == session] == [0, 1, 2], f"session {session} out of order: {seen}"
