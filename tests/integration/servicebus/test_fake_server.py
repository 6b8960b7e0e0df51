"""
The Service Bus test server against the real azure-servicebus SDK.

The fake is only worth testing against if it behaves as the service does where the shared stream
depends on it; these tests pin those behaviours with the SDK's own calls.
"""

from __future__ import annotations

import asyncio
import time

import pytest
from azure.servicebus import NEXT_AVAILABLE_SESSION, ServiceBusSubQueue
from azure.servicebus._pyamqp.error import MessageSettlementUnconfirmed
from azure.servicebus.aio import ServiceBusClient
from azure.servicebus.exceptions import (
    MessageLockLostError,
    ServiceBusAuthenticationError,
    SessionLockLostError,
)

from tests.integration.servicebus.conftest import KEY_NAME, SAS_KEY

pytestmark = pytest.mark.integration


def client_for(servicebus, key: str = SAS_KEY) -> ServiceBusClient:
    return ServiceBusClient.from_connection_string(
        servicebus.connection_string(key_name=KEY_NAME, key=key), retry_total=0
    )


async def test_peek_lock_delivery_carries_what_the_service_sends(servicebus):
    queue = servicebus.create_queue()
    [sent] = servicebus.send(queue, [{"n": 1}], application_properties={"tenant": "acme"}, subject="s")
    async with client_for(servicebus) as client, client.get_queue_receiver(queue) as receiver:
        [message] = await receiver.receive_messages(max_message_count=5, max_wait_time=3)
        assert message.message_id == sent
        assert message.delivery_count == 0  # present, not None: the header is encoded by hand
        assert message.sequence_number == 1
        assert message.lock_token is not None
        assert message.locked_until_utc is not None
        assert message.enqueued_time_utc is not None
        assert message.application_properties == {b"tenant": b"acme"}
        await receiver.complete_message(message)
    assert servicebus.messages(queue) == []


async def test_abandon_raises_delivery_count_and_dead_letter_keeps_the_reason(servicebus):
    queue = servicebus.create_queue()
    servicebus.send(queue, ["a", "b"])
    async with client_for(servicebus) as client, client.get_queue_receiver(queue) as receiver:
        first, second = await receiver.receive_messages(max_message_count=2, max_wait_time=3)
        await receiver.abandon_message(first)
        await receiver.dead_letter_message(second, reason="rejected", error_description="trigger 7: no")
        [again] = await receiver.receive_messages(max_message_count=1, max_wait_time=3)
        assert (str(again), again.delivery_count) == ("a", 1)
        await receiver.complete_message(again)
    async with (
        client_for(servicebus) as client,
        client.get_queue_receiver(queue, sub_queue=ServiceBusSubQueue.DEAD_LETTER) as dead,
    ):
        [letter] = await dead.receive_messages(max_message_count=1, max_wait_time=3)
        assert (str(letter), letter.dead_letter_reason, letter.dead_letter_error_description) == (
            "b",
            "rejected",
            "trigger 7: no",
        )


async def test_expired_lock_redelivers_and_late_settlement_is_lock_lost(servicebus):
    queue = servicebus.create_queue(lock_duration=1)
    servicebus.send(queue, ["x"])
    async with client_for(servicebus) as client, client.get_queue_receiver(queue) as receiver:
        [message] = await receiver.receive_messages(max_message_count=1, max_wait_time=3)
        await asyncio.sleep(1.5)
        with pytest.raises(MessageLockLostError):
            await receiver.complete_message(message)
        [again] = await receiver.receive_messages(max_message_count=1, max_wait_time=3)
        assert again.delivery_count == 1
        await receiver.complete_message(again)


async def test_renewed_lock_is_not_redelivered(servicebus):
    queue = servicebus.create_queue(lock_duration=1)
    servicebus.send(queue, ["x"])
    async with client_for(servicebus) as client, client.get_queue_receiver(queue) as receiver:
        [message] = await receiver.receive_messages(max_message_count=1, max_wait_time=3)
        deadline = time.monotonic() + 3
        while time.monotonic() < deadline:
            await receiver.renew_message_lock(message)
            await asyncio.sleep(0.3)
        assert servicebus.locked_count(queue) == 1
        await receiver.complete_message(message)
    assert servicebus.messages(queue) == []


async def test_topic_fans_out_to_every_subscription(servicebus):
    topic = servicebus.create_topic()
    subs = [servicebus.create_subscription(topic) for _ in range(2)]
    servicebus.send(topic, [{"n": 1}, {"n": 2}])
    async with client_for(servicebus) as client:
        for sub in subs:
            async with client.get_subscription_receiver(topic, sub) as receiver:
                messages = await receiver.receive_messages(max_message_count=5, max_wait_time=3)
                assert [str(m) for m in messages] == ['{"n": 1}', '{"n": 2}']


async def test_sessions_are_locked_to_one_receiver_and_delivered_in_order(servicebus):
    queue = servicebus.create_queue(requires_session=True)
    servicebus.send(queue, [f"m{i}" for i in range(6)], session_id=lambda i: "ab"[i % 2])
    async with (
        client_for(servicebus) as client,
        client.get_queue_receiver(queue, session_id=NEXT_AVAILABLE_SESSION) as receiver,
    ):
        assert receiver.session.session_id == "a"
        messages = await receiver.receive_messages(max_message_count=10, max_wait_time=2)
        assert [str(m) for m in messages] == ["m0", "m2", "m4"]
        for message in messages:
            await receiver.complete_message(message)


async def test_a_session_lock_that_is_not_renewed_expires_and_a_renewed_one_does_not(servicebus):
    # Service Bus's shortest lock: a 1 s lock ran out on a loaded machine between accepting the
    # session and the first receive (the SDK then refuses to receive), before any renewal.
    queue = servicebus.create_queue(requires_session=True, lock_duration=5)
    servicebus.send(queue, ["kept", "lost"], session_id=lambda i: ("kept", "lost")[i])
    async with (
        client_for(servicebus) as client,
        client.get_queue_receiver(queue, session_id="kept") as kept,
        client.get_queue_receiver(queue, session_id="lost") as lost,
    ):
        [held] = await kept.receive_messages(max_message_count=1, max_wait_time=3)
        [dropped] = await lost.receive_messages(max_message_count=1, max_wait_time=3)
        expired_before = servicebus.expired_session_locks
        # Renew one session's lock until the other's has run out on the server (within 100 rounds).
        for _ in range(100):
            if servicebus.expired_session_locks > expired_before:
                break
            await kept.session.renew_lock()
            await asyncio.sleep(0.2)
        assert servicebus.expired_session_locks == expired_before + 1
        await kept.complete_message(held)
        with pytest.raises(SessionLockLostError):
            await lost.session.renew_lock()
    # The expired session's message came back, its delivery count raised; the renewed one is gone.
    [back] = servicebus.messages(queue)
    assert (back.session_id, back.delivery_count, back.lock_token) == ("lost", 1, None)
    assert str(dropped) == "lost"


async def test_a_lapsed_session_lock_counts_the_prefetched_messages_and_a_closed_receiver_none(servicebus):
    """
    FIDELITY rows "Service Bus session lock expiry" (+1 on every message locked on the link) and
    "Service Bus session receiver closed with unsettled messages" (count unchanged): the server
    counts a delivery of the messages a prefetching receiver holds, never handed to the
    application, when the session lock lapses, and none when the receiver is closed.
    """
    queue = servicebus.create_queue(requires_session=True, lock_duration=5)
    servicebus.send(queue, ["1", "2", "3"], session_id="lapsing")
    servicebus.send(queue, ["1", "2", "3"], session_id="closed")
    async with client_for(servicebus) as client:
        for session_id in ("lapsing", "closed"):
            receiver = client.get_queue_receiver(queue, session_id=session_id, prefetch_count=5)
            async with receiver:
                [first] = await receiver.receive_messages(max_message_count=1, max_wait_time=3)
                assert str(first) == "1"
                prefetched = [m for m in servicebus.messages(queue) if m.session_id == session_id]
                assert [m.lock_token is not None for m in prefetched] == [True, True, True]
                if session_id == "lapsing":
                    expired_before = servicebus.expired_session_locks
                    for _ in range(100):  # the 5 s lock runs out on the server within 20 s
                        if servicebus.expired_session_locks > expired_before:
                            break
                        await asyncio.sleep(0.2)
    counts = {(m.session_id, m.body): m.delivery_count for m in servicebus.messages(queue)}
    assert counts == {
        **{("lapsing", n): 1 for n in (b"1", b"2", b"3")},
        **{("closed", n): 0 for n in (b"1", b"2", b"3")},
    }


async def test_ignore_ranges_applies_a_ranged_disposition_to_its_first_delivery_only(servicebus):
    queue = servicebus.create_queue()
    servicebus.send(queue, ["a", "b", "c"])
    servicebus.ignore_ranges = True
    try:
        async with client_for(servicebus) as client, client.get_queue_receiver(queue) as receiver:
            messages = await receiver.receive_messages(max_message_count=3, max_wait_time=3)
            assert [str(m) for m in messages] == ["a", "b", "c"]
            first, last = messages[0], messages[-1]
            with pytest.raises(MessageSettlementUnconfirmed):
                await receiver._handler.settle_messages_async(
                    (first._delivery_id, last._delivery_id),
                    first._delivery_tag,
                    "accepted",
                    await_outcome=True,
                    outcome_timeout=1,
                )
            assert [m.body for m in servicebus.messages(queue)] == [b"b", b"c"]
            assert servicebus.locked_count(queue) == 2
    finally:
        servicebus.ignore_ranges = False


async def test_bad_signature_is_refused(servicebus):
    queue = servicebus.create_queue()
    async with client_for(servicebus, key="d3JvbmcK") as client:
        with pytest.raises(ServiceBusAuthenticationError):
            async with client.get_queue_receiver(queue) as receiver:
                await receiver.receive_messages(max_message_count=1, max_wait_time=1)
    assert servicebus.refused_tokens >= 1
