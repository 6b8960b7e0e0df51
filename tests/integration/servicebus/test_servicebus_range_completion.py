"""
ACKs complete runs of consecutive deliveries with one disposition each (servicebus/ranges.py).

Against the test server (Qpid Proton applies a disposition to every delivery of its range, as
AMQP says): every message of a run is completed and none comes back, a message in the middle
with another outcome splits the run and keeps its own settlement, the receive link keeps no tag
of a message completed in a range, a message whose lock ran out is not sent in a range (it is
completed alone, refused and counted, and comes back), and ``complete_in_ranges=False`` goes
back to one ``complete_message`` per message. A range never covers a delivery still in flight,
and a broker that applies a range to its first delivery only costs speed, not a redelivery.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import pytest
from airflow.triggers.shared_stream import AdvanceItem, AdvanceOutcome

from airflow_shared_stream.servicebus import ServiceBusSharedStreamProducer
from tests.support.waiting import eventually

pytestmark = pytest.mark.integration

ACKED = AdvanceOutcome(acked=1, failed=0, rejected=0)
FAILED = AdvanceOutcome(acked=0, failed=1, rejected=0)


@contextlib.asynccontextmanager
async def _streaming(
    queue: str, connection: str, count: int, **kwargs: Any
) -> AsyncIterator[tuple[ServiceBusSharedStreamProducer, Any]]:
    """A producer of ``count`` credits on ``queue`` and its open stream, both closed after."""
    producer = ServiceBusSharedStreamProducer(
        queue_name=queue,
        azure_service_bus_conn_id=connection,
        max_in_flight=count,
        max_wait_time=2,
        **kwargs,
    )
    stream = producer.open_stream()
    try:
        yield producer, stream
    finally:
        await stream.aclose()
        await producer.aclose()


async def _receive(stream: Any, count: int, timeout: float = 10) -> list[Any]:
    return [(await asyncio.wait_for(anext(stream), timeout))[1] for _ in range(count)]


def _held_tags(producer: ServiceBusSharedStreamProducer) -> set[bytes]:
    """The receive link's tags of deliveries received and not settled on it (the SDK's own set)."""
    return producer._receiver._handler._link._received_delivery_tags


async def test_a_batch_of_acks_is_completed_in_one_disposition(servicebus, servicebus_connection):
    queue = servicebus.create_queue()
    servicebus.send(queue, [{"n": n} for n in range(40)])
    async with _streaming(queue, servicebus_connection, 40) as (producer, stream):
        handles = await _receive(stream, 40)
        settle_before, settled_before = servicebus.requests["settle"], servicebus.settled_deliveries
        await producer.advance([AdvanceItem(handle, ACKED) for handle in handles])
        await eventually(lambda: servicebus.messages(queue), lambda m: m == [], timeout=10, what="completed")
        assert servicebus.settled_deliveries - settled_before == 40
        # One receive can hand over its messages in more than one transfer burst, but the ACK
        # batch is one run of consecutive deliveries: one disposition, not forty.
        assert servicebus.requests["settle"] - settle_before == 1
        assert producer.ranges_completed == 1
        assert producer.lost_locks == 0
        assert _held_tags(producer) == set(), "the link still holds tags of completed messages"
    assert servicebus.messages(queue) == []


async def test_a_message_with_another_outcome_splits_the_run_and_keeps_its_settlement(
    servicebus, servicebus_connection
):
    queue = servicebus.create_queue()
    sent = servicebus.send(queue, [{"n": n} for n in range(10)])
    async with _streaming(queue, servicebus_connection, 10) as (producer, stream):
        handles = await _receive(stream, 10)
        settle_before = servicebus.requests["settle"]
        outcomes = [FAILED if n == 4 else ACKED for n in range(10)]
        await producer.advance([AdvanceItem(h, o) for h, o in zip(handles, outcomes, strict=True)])
        # The failed one is abandoned (inline), the ACKs before and after it go out as two ranges.
        raw, handle = await asyncio.wait_for(anext(stream), 10)
        assert (raw.envelope["message_id"], raw.envelope["delivery_count"]) == (sent[4], 1)
        await eventually(
            lambda: len(servicebus.messages(queue)), lambda n: n == 1, timeout=10, what="nine completed"
        )
        assert producer.ranges_completed == 2
        assert servicebus.requests["settle"] - settle_before == 3  # two ranges and one abandon
        await producer.advance([AdvanceItem(handle, ACKED)])
        await eventually(lambda: servicebus.messages(queue), lambda m: m == [], timeout=10, what="completed")
        assert producer.lost_locks == 0
        assert _held_tags(producer) == set()


async def test_a_lock_that_ran_out_is_not_sent_in_a_range(servicebus, servicebus_connection):
    """
    The messages come back and their run goes out as one disposition again.

    The locks are left to run out (the lease keeper stopped) only for the first round: renewed
    again once the redelivered messages are in (not before, or a renewal's ``$management`` answer
    could land between them and break their run of delivery ids). The range's outcome is awaited
    for a third of the lock left (``ranges.outcome_timeout``, at most a second of this 3 s lock):
    on a loaded machine it can come later, and the run is then completed one by one, each refused
    as already completed. Either way the run was ONE disposition and nothing came back.
    """
    queue = servicebus.create_queue(lock_duration=3)
    sent = servicebus.send(queue, [{"n": n} for n in range(5)])
    async with _streaming(queue, servicebus_connection, 5) as (producer, stream):
        handles = await _receive(stream, 5)
        await producer._leases.stop()  # so the locks run out
        await eventually(
            lambda: [h.delivery.handle.message._lock_expired for h in handles],
            all,
            timeout=30,
            what="every lock run out, as the SDK reads it",
        )
        # ... and on the server: all five wait there, so the receive the advance frees the credits
        # for takes them in one go (a message that arrives while no receive waits is released by
        # the SDK and comes back later with a new delivery id, which would break their run).
        await eventually(
            lambda: [m.lock_token for m in servicebus.messages(queue)],
            lambda tokens: len(tokens) == 5 and not any(tokens),
            timeout=30,
            what="every lock run out on the server",
        )
        await producer.advance([AdvanceItem(handle, ACKED) for handle in handles])
        # Each is completed alone, refused (lock lost), counted, and comes back.
        await eventually(lambda: producer.lost_locks, lambda n: n == 5, timeout=30, what="5 locks lost")
        assert producer.ranges_completed == 0
        again = await _receive(stream, 5, timeout=60)
        producer._leases.start()
        assert sorted(h.delivery.message_id for h in again) == sorted(sent)
        settle_before, locked_before = servicebus.requests["settle"], servicebus.locked_deliveries
        await producer.advance([AdvanceItem(handle, ACKED) for handle in again])
        await eventually(lambda: servicebus.messages(queue), lambda m: m == [], timeout=30, what="completed")
        ranges = (producer.ranges_completed, producer.ranges_unconfirmed)
        assert sum(ranges) == 1, f"(completed, unconfirmed) ranges: {ranges}"
        assert servicebus.requests["settle"] - settle_before == 1, "the run was not sent as one disposition"
        assert not producer.ranges_ignored, "the server applied the range to every delivery of it"
        assert servicebus.locked_deliveries == locked_before, "a message of the run came back"
        assert producer.lost_locks == 5


async def test_complete_in_ranges_false_completes_one_by_one(servicebus, servicebus_connection):
    queue = servicebus.create_queue()
    servicebus.send(queue, [{"n": n} for n in range(10)])
    async with _streaming(queue, servicebus_connection, 10, complete_in_ranges=False) as (producer, stream):
        handles = await _receive(stream, 10)
        settle_before = servicebus.requests["settle"]
        await producer.advance([AdvanceItem(handle, ACKED) for handle in handles])
        await eventually(lambda: servicebus.messages(queue), lambda m: m == [], timeout=10, what="completed")
        assert servicebus.requests["settle"] - settle_before == 10
        assert producer.ranges_completed == 0
        assert _held_tags(producer) == set()


@pytest.mark.parametrize("acked", [(0, 1), (0, 2)], ids=["the third in flight", "the second in flight"])
async def test_a_range_never_covers_a_delivery_still_in_flight(servicebus, servicebus_connection, acked):
    queue = servicebus.create_queue()
    sent = servicebus.send(queue, [{"n": n} for n in range(3)])
    async with _streaming(queue, servicebus_connection, 3) as (producer, stream):
        handles = await _receive(stream, 3)
        assert [h.delivery.message_id for h in handles] == sent
        [in_flight] = [h for n, h in enumerate(handles) if n not in acked]
        await producer.advance([AdvanceItem(handles[n], ACKED) for n in acked])
        # Both ACKs go out in one batch once the ACK batcher's linger ends.
        await eventually(lambda: servicebus.messages(queue), lambda m: len(m) == 1, timeout=10, what="2 done")
        [left] = servicebus.messages(queue)
        assert left.sequence_number == in_flight.delivery.handle.message.sequence_number
        assert left.lock_token is not None, "the message in flight lost its lock"
        await producer.advance([AdvanceItem(in_flight, ACKED)])
        await eventually(lambda: servicebus.messages(queue), lambda m: m == [], timeout=10, what="completed")
        assert producer.lost_locks == 0


async def test_a_broker_that_ignores_ranges_costs_speed_not_redeliveries(servicebus, servicebus_connection):
    queue = servicebus.create_queue(lock_duration=5)
    servicebus.send(queue, [{"n": n} for n in range(10)])
    delivered_before = servicebus.locked_deliveries
    servicebus.ignore_ranges = True
    try:
        async with _streaming(queue, servicebus_connection, 10) as (producer, stream):
            handles = await _receive(stream, 10)
            await producer.advance([AdvanceItem(handle, ACKED) for handle in handles])
            await eventually(
                lambda: servicebus.messages(queue), lambda m: m == [], timeout=20, what="all 10 completed"
            )
            # Noticed: the range was completed message by message, none came back.
            assert producer.ranges_unconfirmed == 1
            assert producer.ranges_ignored
            assert servicebus.locked_deliveries - delivered_before == 10, "a message was redelivered"
            # ... and from now on the stream completes one by one: no range, no wait for one.
            servicebus.send(queue, [{"n": n} for n in range(4)])
            more = await _receive(stream, 4)
            settle_before = servicebus.requests["settle"]
            await producer.advance([AdvanceItem(handle, ACKED) for handle in more])
            await eventually(lambda: servicebus.messages(queue), lambda m: m == [], timeout=10, what="4 done")
            assert servicebus.requests["settle"] - settle_before == 4
            assert producer.ranges_unconfirmed == 1
    finally:
        servicebus.ignore_ranges = False
