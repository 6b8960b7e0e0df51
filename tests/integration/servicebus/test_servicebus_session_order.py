"""
A session is an ordered lane: what Service Bus hands out of one session keeps its order through redeliveries.

The contract (tests/integration/contract) checks the order through the manager; these tests
take the producer through the paths where the client itself could reorder a session: a
redelivered message that arrives while no receive call waits, and the messages a receiver
holds beyond the window when an earlier one is redelivered.
"""

from __future__ import annotations

import asyncio

import pytest
from airflow.triggers.shared_stream import AdvanceItem, AdvanceOutcome

from airflow_shared_stream.servicebus import ServiceBusSharedStreamProducer
from tests.support.waiting import eventually

pytestmark = pytest.mark.integration

FAILED = AdvanceOutcome(acked=0, failed=1, rejected=0)
ACKED = AdvanceOutcome(acked=1, failed=0, rejected=0)
NOBODY = AdvanceOutcome(acked=0, failed=0, rejected=0)


def session_producer(
    queue: str, connection: str, *, max_in_flight: int, max_concurrent_sessions: int = 8
) -> ServiceBusSharedStreamProducer:
    return ServiceBusSharedStreamProducer(
        queue_name=queue,
        azure_service_bus_conn_id=connection,
        max_in_flight=max_in_flight,
        max_wait_time=1,
        session_enabled=True,
        max_concurrent_sessions=max_concurrent_sessions,
    )


async def test_a_redelivery_that_arrives_between_receives_is_kept_in_order(servicebus, servicebus_connection):
    """
    Regression (CI, 2026-11-25: the lane came back as [2, 1]): the SDK released a message that
    arrived while no receive call waited.

    Without prefetch the SDK gives back ("releases") a message the service sends while no
    receive call waits. Service Bus sends an abandoned session message straight back over the
    link's spare credit: 1 arrived between two receives and was released, 2 arrived during the
    next receive and was handed out, and 1 came after it.
    """
    queue = servicebus.create_queue(requires_session=True)
    servicebus.send(queue, [{"seq": 1}, {"seq": 2}], session_id="g")
    producer = session_producer(queue, servicebus_connection, max_in_flight=10)
    stream = producer.open_stream()
    try:
        first = [await asyncio.wait_for(anext(stream), timeout=20) for _ in range(2)]
        assert [raw.envelope["body"]["seq"] for raw, _ in first] == [1, 2]
        await asyncio.sleep(1.5)  # the receive read ahead returns empty: none waits now
        released_before = servicebus.released_deliveries
        await producer.advance([AdvanceItem(first[0][1], FAILED), AdvanceItem(first[1][1], ACKED)])
        await asyncio.sleep(6.0)  # the SDK's keep-alive reads the connection every 5 s
        assert servicebus.released_deliveries == released_before, "the client released a session message"
        again = [await asyncio.wait_for(anext(stream), timeout=20) for _ in range(2)]
        assert [raw.envelope["body"]["seq"] for raw, _ in again] == [1, 2]
        await producer.advance([AdvanceItem(payload, ACKED) for _, payload in again])
        await eventually(lambda: servicebus.messages(queue), lambda m: m == [], timeout=20, what="completed")
    finally:
        await stream.aclose()
        await producer.aclose()


async def test_a_redelivery_comes_back_ahead_of_the_rest_of_a_long_session(servicebus, servicebus_connection):
    """
    A session longer than the window: when 1 fails, 1 and 2 come back before 3 to 6.

    3 to 6 wait at the service, or in the receiver's prefetch buffer, while 1 and 2 are in
    flight. The service puts an abandoned message back at the head of its session, but what the
    client already holds is ahead of it on the link: the producer gives the session up
    (closing its receiver releases what it holds) and takes it again from the head.
    """
    queue = servicebus.create_queue(requires_session=True)
    servicebus.send(queue, [{"seq": n} for n in range(1, 7)], session_id="g")
    # One session: its receiver prefetches the whole window (2), so the link's credit (3) lets
    # the service send 3 while 1 and 2 are in flight.
    producer = session_producer(queue, servicebus_connection, max_in_flight=2, max_concurrent_sessions=1)
    stream = producer.open_stream()
    order: list[int] = []
    try:
        first = [await asyncio.wait_for(anext(stream), timeout=20) for _ in range(2)]
        assert [raw.envelope["body"]["seq"] for raw, _ in first] == [1, 2]
        await asyncio.sleep(1.0)  # whatever the receiver reads ahead arrives meanwhile
        await producer.advance([AdvanceItem(first[0][1], FAILED), AdvanceItem(first[1][1], ACKED)])
        while len(order) < 6:
            raw, payload = await asyncio.wait_for(anext(stream), timeout=20)
            order.append(raw.envelope["body"]["seq"])
            await producer.advance([AdvanceItem(payload, ACKED)])
        await eventually(lambda: servicebus.messages(queue), lambda m: m == [], timeout=20, what="completed")
    finally:
        await stream.aclose()
        await producer.aclose()
    assert order == [1, 2, 3, 4, 5, 6], f"the session was handed back out of order: {order}"
    assert producer.lost_locks == 0


async def test_a_session_given_up_while_its_messages_are_held_unseen_hands_each_out_once(
    servicebus, servicebus_connection
):
    """
    FAULT_MODEL class 5 (a lock lost): a session given up while messages of it reached nobody
    and are held (its lock found lost by its own renewal, or a receive that found it gone).
    FIDELITY row "Service Bus session receiver closed with unsettled messages": the service has
    them back, and the session, taken again, brings them again. Offered again from the closed
    receiver as well, they reached the returning watcher twice (CI: the lane came back as
    ``[0, 0, 1, 2]``): held copies of a closed session are dropped, not offered.
    """
    queue = servicebus.create_queue(requires_session=True, lock_duration=30)
    servicebus.send(queue, [{"n": n} for n in range(2)], session_id="g")
    producer = session_producer(queue, servicebus_connection, max_in_flight=4, max_concurrent_sessions=1)
    stream = producer.open_stream()
    handed: list[int] = []
    try:
        first = [await asyncio.wait_for(anext(stream), 30) for _ in range(2)]
        assert [raw.envelope["body"]["n"] for raw, _ in first] == [0, 1]
        await producer.advance([AdvanceItem(payload, NOBODY) for _, payload in first])  # held unseen
        [session] = producer._sessions.held
        await producer._sessions.release(session)  # as a renewal that found its lock lost does
        # A session's ACK is sent within its advance: once the queue is empty, all is handed out.
        while servicebus.messages(queue) and len(handed) < 6:
            raw, payload = await asyncio.wait_for(anext(stream), 60)
            handed.append(raw.envelope["body"]["n"])
            await producer.advance([AdvanceItem(payload, ACKED)])
    finally:
        await stream.aclose()
        await producer.aclose()
    assert handed == [0, 1], f"handed out after the session was given up: {handed}"
    assert producer.lost_locks == 0, "a held copy of the closed session was offered and its ACK refused"
