"""
Lock renewals: one ``renew-lock`` request carries every held lock of a receiver.

Service Bus's ``$management`` ``com.microsoft:renew-lock`` takes a list of lock tokens; renewing
one token per request cost one socket-timeout wait per held message behind a pending receive,
so a renewal round over a full credit window took many seconds.
"""

from __future__ import annotations

import asyncio

import pytest

from airflow_shared_stream.servicebus import ServiceBusSharedStreamProducer

pytestmark = pytest.mark.integration


def management_requests(servicebus) -> int:
    return sum(n for kind, n in servicebus.requests.items() if kind.startswith("$management"))


def producer_for(queue: str, connection: str) -> ServiceBusSharedStreamProducer:
    return ServiceBusSharedStreamProducer(
        queue_name=queue, azure_service_bus_conn_id=connection, max_in_flight=20, max_wait_time=1
    )


async def no_background_renewals(producer: ServiceBusSharedStreamProducer) -> None:
    """Stop the producer's lease keeper: the test runs the renewal rounds itself."""
    await producer._leases.stop()


async def test_one_request_renews_every_held_lock(servicebus, servicebus_connection):
    queue = servicebus.create_queue(lock_duration=30)
    servicebus.send(queue, [{"n": n} for n in range(5)])
    producer = producer_for(queue, servicebus_connection)
    stream = producer.open_stream()
    try:
        handles = [(await asyncio.wait_for(anext(stream), 10))[1] for _ in range(5)]
        await no_background_renewals(producer)
        messages = [h.delivery.handle.message for h in handles]
        sdk_before = [m.locked_until_utc for m in messages]
        broker_before = {m.sequence_number: m.locked_until_ms for m in servicebus.messages(queue)}
        requests_before = management_requests(servicebus)
        await asyncio.sleep(0.05)  # so a renewed lock ends later than the first one

        assert await producer._leases.renew_once() == 5

        assert management_requests(servicebus) - requests_before == 1
        broker_after = {m.sequence_number: m.locked_until_ms for m in servicebus.messages(queue)}
        assert all(broker_after[n] > broker_before[n] for n in broker_before)
        # The SDK records each new expiry: it refuses to settle a message whose lock it thinks ran out.
        assert all(m.locked_until_utc > before for m, before in zip(messages, sdk_before, strict=True))
        assert producer.lost_locks == 0
    finally:
        await stream.aclose()
        await producer.aclose()


async def test_a_lost_lock_among_them_is_found_and_the_others_are_renewed(servicebus, servicebus_connection):
    queue = servicebus.create_queue(lock_duration=2)
    [sent] = servicebus.send(queue, [{"n": 1}])
    producer = producer_for(queue, servicebus_connection)
    stream = producer.open_stream()
    try:
        first = (await asyncio.wait_for(anext(stream), 10))[1]
        await no_background_renewals(producer)
        await asyncio.sleep(2.5)  # its lock runs out on the broker; the message comes back
        again = (await asyncio.wait_for(anext(stream), 10))[1]
        assert again.delivery.message_id == first.delivery.message_id == sent
        assert again.delivery.lease != first.delivery.lease
        [stored] = servicebus.messages(queue)
        locked_until = stored.locked_until_ms

        # Together the request fails (one lock is gone); one by one tells which.
        assert await producer._leases.renew_once() == 1

        assert first.delivery.lease not in producer._leases
        assert again.delivery.lease in producer._leases
        [stored] = servicebus.messages(queue)
        assert stored.locked_until_ms > locked_until
    finally:
        await stream.aclose()
        await producer.aclose()
