"""
ACK batches go out in the background: the advance that fills one returns before the broker has
it, the lease is kept until the batch is on the wire, and ``aclose`` waits for it.

Before, ``advance`` awaited each full batch inline, so on Service Bus (whose SDK awaits every
settlement's outcome) the manager's advance and the credits it returns waited for the round
trip, one batch after another: the receive loop sat idle for it (bench/watchers.py).
"""

from __future__ import annotations

import asyncio

import pytest
from airflow.triggers.shared_stream import AdvanceItem, AdvanceOutcome

from airflow_shared_stream.servicebus import ServiceBusSharedStreamProducer
from airflow_shared_stream.servicebus.producer import SETTLE_BATCH_LIMIT
from tests.support.waiting import eventually

pytestmark = pytest.mark.integration

ACKED = AdvanceOutcome(acked=1, failed=0, rejected=0)


async def test_advance_returns_while_the_ack_batch_is_on_the_wire_and_aclose_waits_for_it(
    servicebus, servicebus_connection
):
    queue = servicebus.create_queue()
    servicebus.send(queue, [{"n": n} for n in range(SETTLE_BATCH_LIMIT)])
    producer = ServiceBusSharedStreamProducer(
        queue_name=queue,
        azure_service_bus_conn_id=servicebus_connection,
        max_in_flight=SETTLE_BATCH_LIMIT,
        max_wait_time=2,
    )
    stream = producer.open_stream()
    closed = False
    try:
        handles = [(await asyncio.wait_for(anext(stream), 10))[1] for _ in range(SETTLE_BATCH_LIMIT)]
        assert servicebus.locked_count(queue) == SETTLE_BATCH_LIMIT

        # One full ACK batch: advance returns without waiting for the broker's answer.
        await producer.advance([AdvanceItem(handle, ACKED) for handle in handles])
        assert producer.in_flight == 0  # the credits are back
        assert servicebus.locked_count(queue) == SETTLE_BATCH_LIMIT, "the ACKs were sent inline"
        # Until the batch is on the wire its locks are still renewed (the lease keeper holds them).
        leases = {handle.delivery.lease for handle in handles}
        assert leases <= {d.lease for d in producer.held_deliveries()}
        assert all(lease in producer._leases for lease in leases)

        # aclose sends what is on the wire and waits for it, and gives none of it back.
        await stream.aclose()
        await producer.aclose()
        closed = True
        assert servicebus.locked_count(queue) == 0
        assert servicebus.messages(queue) == []
        assert producer.lost_locks == 0
    finally:
        if not closed:
            await stream.aclose()
            await producer.aclose()


async def test_a_failed_background_ack_is_raised_from_the_next_advance(servicebus, servicebus_connection):
    queue = servicebus.create_queue()
    servicebus.send(queue, [{"n": n} for n in range(SETTLE_BATCH_LIMIT + 1)])
    producer = ServiceBusSharedStreamProducer(
        queue_name=queue,
        azure_service_bus_conn_id=servicebus_connection,
        max_in_flight=SETTLE_BATCH_LIMIT + 1,
        max_wait_time=2,
    )
    stream = producer.open_stream()
    try:
        handles = [(await asyncio.wait_for(anext(stream), 10))[1] for _ in range(SETTLE_BATCH_LIMIT + 1)]

        async def refused(deliveries):
            raise RuntimeError("the namespace refused the complete")

        producer.ack = refused  # type: ignore[method-assign]
        await producer.advance([AdvanceItem(handle, ACKED) for handle in handles[:-1]])
        await eventually(
            lambda: producer._acks.error, lambda e: e is not None, timeout=10, what="failed send"
        )
        with pytest.raises(RuntimeError, match="refused the complete"):
            await producer.advance([AdvanceItem(handles[-1], ACKED)])
        # Nothing was completed: the broker still holds every message (its locks run out).
        assert len(servicebus.messages(queue)) == SETTLE_BATCH_LIMIT + 1
    finally:
        await stream.aclose()
        await producer.aclose()
