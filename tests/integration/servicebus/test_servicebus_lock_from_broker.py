"""
Locks are renewed from what Service Bus says they are, not from a trigger argument.

Every peek-lock delivery carries its lock's expiry (``locked_until_utc``), and a session receiver
its session's: the producer renews from those. With a renewal period taken from an argument (60 s
by default), an entity whose lock is 5 s let every lock run out while the trigger events waited
for persistence, and each message was handed out, and fired, twice.
"""

from __future__ import annotations

import pytest

from airflow_shared_stream.servicebus import ServiceBusSharedStreamTrigger
from airflow_shared_stream.testing import SharedStreamHarness
from tests.support.waiting import eventually

pytestmark = pytest.mark.integration

HELD_SECONDS = 8.0
"""How long each trigger event waits for persistence: longer than the entity's 5 s lock."""


async def test_message_locks_are_renewed_from_the_brokers_lock_not_the_default(
    servicebus, servicebus_connection
):
    queue = servicebus.create_queue(lock_duration=5)
    lost_before = servicebus.lock_lost_settlements
    async with SharedStreamHarness(confirm_after=HELD_SECONDS) as harness:
        watchers = [
            harness.add(ServiceBusSharedStreamTrigger(queue, match=f"body.n >= `{k}`")) for k in range(3)
        ]
        sent = servicebus.send(queue, [{"n": n} for n in range(60)])
        await eventually(lambda: servicebus.messages(queue), lambda m: m == [], timeout=60, what="completed")
    for k, watcher in enumerate(watchers):
        fired = [p["message_id"] for p in watcher.payloads]
        assert sorted(fired) == sorted(sent[k:]), f"watcher {k} fired a message twice, or missed one"
        assert {p["delivery_count"] for p in watcher.payloads} == {0}, "a lock ran out: redelivered"
    assert servicebus.lock_lost_settlements == lost_before


async def test_session_locks_are_renewed_from_the_brokers_lock(servicebus, servicebus_connection):
    queue = servicebus.create_queue(lock_duration=5, requires_session=True)
    expired_before = servicebus.expired_session_locks
    lost_before = servicebus.lock_lost_settlements
    async with SharedStreamHarness(confirm_after=HELD_SECONDS) as harness:
        watcher = harness.add(ServiceBusSharedStreamTrigger(queue, session_enabled=True, max_wait_time=1))
        sent = servicebus.send(queue, [{"n": n} for n in range(10)], session_id="g")
        await eventually(lambda: servicebus.messages(queue), lambda m: m == [], timeout=60, what="completed")
    assert [p["message_id"] for p in watcher.payloads] == sent, "fired twice, or out of order"
    assert {p["delivery_count"] for p in watcher.payloads} == {0}
    assert servicebus.expired_session_locks == expired_before, "the session lock ran out"
    assert servicebus.lock_lost_settlements == lost_before
