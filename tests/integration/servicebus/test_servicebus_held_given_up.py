"""
Attack on fix/sb-ci-flakes: a session given up while later messages of it are held back.

The change drops held copies of a session whose receiver is closed (``taken_back``) to stop a
returning watcher getting ``[0, 0, 1, 2]``. A session is also given up after a message of it
fails: the messages behind it in the lane (that no watcher saw) are held back and redelivered
with it. These tests take that path against the Service Bus test server.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from airflow.triggers.shared_stream import AdvanceItem, AdvanceOutcome

from tests.integration.servicebus.test_servicebus_session_order import session_producer

pytestmark = pytest.mark.integration

FAILED = AdvanceOutcome(acked=0, failed=1, rejected=0)
ACKED = AdvanceOutcome(acked=1, failed=0, rejected=0)
NOBODY = AdvanceOutcome(acked=0, failed=0, rejected=0)


async def _fail_the_head(servicebus: Any, connection: str) -> tuple[list[tuple[int, int]], int]:
    """0 fails, 1 and 2 reached nobody; then everything handed out, ACKed: ``[(n, delivery count)]``."""
    queue = servicebus.create_queue(requires_session=True, lock_duration=30)
    servicebus.send(queue, [{"n": n} for n in range(3)], session_id="g")
    producer = session_producer(queue, connection, max_in_flight=4, max_concurrent_sessions=1)
    stream = producer.open_stream()
    handed: list[tuple[int, int]] = []
    try:
        first = [await asyncio.wait_for(anext(stream), 30) for _ in range(3)]
        assert [raw.envelope["body"]["n"] for raw, _ in first] == [0, 1, 2]
        assert [p.delivery.handle.message.delivery_count for _, p in first] == [0, 0, 0]
        await producer.advance(
            [
                AdvanceItem(first[0][1], FAILED),
                AdvanceItem(first[1][1], NOBODY),
                AdvanceItem(first[2][1], NOBODY),
            ]
        )
        while servicebus.messages(queue) and len(handed) < 8:
            raw, payload = await asyncio.wait_for(anext(stream), 60)
            handed.append((raw.envelope["body"]["n"], payload.delivery.handle.message.delivery_count))
            await producer.advance([AdvanceItem(payload, ACKED)])
    finally:
        await stream.aclose()
        await producer.aclose()
    return handed, producer.lost_locks


async def test_messages_nobody_saw_behind_a_failed_session_head_spend_no_delivery_attempt(
    servicebus, servicebus_connection
):
    """
    FAULT_MODEL class 4 (delivery budgets), 16 (FIDELITY: a closed session receiver returns
    what it held uncounted; an abandon counts one): 0 fails, 1 and 2 reached nobody. The
    session is given up and taken again from its head; 1 and 2, held back behind 0, must come
    back with their delivery count unchanged. Failing: ``redeliver`` gets the whole lane in one
    call and abandons all three (the session is marked ``restarting`` only after the abandons),
    so 1 and 2 come back counted (``[(0, 1), (1, 1), (2, 1)]``): with ``MaxDeliveryCount``
    reached they are dead-lettered though no watcher ever saw them.
    """
    handed, _ = await _fail_the_head(servicebus, servicebus_connection)
    counts = {n: count for n, count in handed}
    assert counts.get(1) == 0, f"(n, delivery count) handed out: {handed}"
    assert counts.get(2) == 0, f"(n, delivery count) handed out: {handed}"


async def test_a_failed_session_head_is_handed_out_again_once_and_ahead_of_the_rest(
    servicebus, servicebus_connection
):
    """
    FAULT_MODEL classes 5 (locks) and 9 (order): 0 fails, 1 and 2 reached nobody. Handed out
    afterwards: 0, 1, 2, each once. Failing (``[0, 0, 1, 2]``, the CI symptom the merged change
    names, by another path: ``taken_back`` is never consulted): the service sends the abandoned
    0 straight back on the session's receiver while the other abandons are still awaited, before
    the session is marked ``restarting``; a receive hands it out, the session is then given up,
    its ACK is refused (a lost lock) and 0 reaches the watchers a second time.
    """
    handed, lost_locks = await _fail_the_head(servicebus, servicebus_connection)
    assert [n for n, _ in handed] == [0, 1, 2], f"(n, delivery count) handed out: {handed}"
    assert lost_locks == 0
