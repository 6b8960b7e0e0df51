"""
What only a Service Bus stream has, against the AMQP test server: the message envelope, the
dead-letter reason naming the watcher, a lost lock, topic subscriptions and session receivers.
The behaviour every broker shares is in the contract (test_servicebus_contract.py).
"""

from __future__ import annotations

import asyncio
import json

import pytest
from airflow.triggers.shared_stream import AdvanceItem, AdvanceOutcome

from airflow_shared_stream.servicebus import ServiceBusSharedStreamProducer, ServiceBusSharedStreamTrigger
from tests.integration.servicebus.conftest import SAS_KEY
from tests.support.waiting import eventually

pytestmark = pytest.mark.integration


def ids_of(watcher) -> list[str]:
    return [p["message_id"] for p in watcher.payloads]


async def test_envelope_has_the_message_metadata_and_no_secret(servicebus, servicebus_connection, harness):
    queue = servicebus.create_queue()
    watcher = harness.add(
        ServiceBusSharedStreamTrigger(queue, match="application_properties.tenant == 'acme'")
    )
    servicebus.send(
        queue,
        [{"id": 1}, "plain text"],
        application_properties={"tenant": "acme", "priority": 7},
        content_type="application/json",
        correlation_id="corr-1",
        subject="order",
    )
    await watcher.wait_for_events(2)
    payload = watcher.payloads[0]
    assert payload["body"] == {"id": 1}
    assert watcher.payloads[1]["body"] == "plain text"
    assert payload["application_properties"] == {"tenant": "acme", "priority": 7}
    assert (payload["content_type"], payload["correlation_id"], payload["subject"]) == (
        "application/json",
        "corr-1",
        "order",
    )
    assert payload["sequence_number"] >= 1
    assert payload["delivery_count"] == 0
    assert payload["enqueued_time"].startswith("20")
    assert payload["session_id"] is None
    assert payload["entity"] == queue
    text = json.dumps(watcher.payloads)
    assert SAS_KEY not in text
    assert "lock_token" not in text


async def test_reject_dead_letters_with_the_watcher_named(servicebus, servicebus_connection, harness):
    queue = servicebus.create_queue()
    picky = harness.add(ServiceBusSharedStreamTrigger(queue, reject="body.bad"))
    easy = harness.add(ServiceBusSharedStreamTrigger(queue))
    servicebus.send(queue, [{"bad": True, "n": 1}, {"n": 2}])
    await easy.wait_for_events(2)
    await eventually(
        lambda: servicebus.dead_letters(queue), lambda d: len(d) == 1, timeout=20, what="one dead letter"
    )
    await eventually(lambda: servicebus.messages(queue), lambda m: m == [], timeout=20, what="source empty")
    [letter] = servicebus.dead_letters(queue)
    properties = letter.application_properties
    assert properties["DeadLetterReason"] == "rejected"
    assert f"trigger {picky.trigger_id}" in properties["DeadLetterErrorDescription"]
    assert "body.bad" in properties["DeadLetterErrorDescription"]


async def test_lost_lock_is_a_redelivery_not_a_crash(servicebus, servicebus_connection):
    queue = servicebus.create_queue(lock_duration=3)
    [sent] = servicebus.send(queue, [{"n": 1}])
    # The producer's lease keeper is stopped, so the server's 3 s lock runs out before the
    # message is settled. (The redelivered message's new lock must outlast the wait for the first
    # ACK's refusal, which is answered in the background: with 1 s it sometimes expired in the
    # receiver's buffer before its ACK.)
    producer = ServiceBusSharedStreamProducer(
        queue_name=queue, azure_service_bus_conn_id=servicebus_connection, max_in_flight=10, max_wait_time=2
    )
    stream = producer.open_stream()
    try:
        raw, handle = await anext(stream)
        await producer._leases.stop()
        assert raw.envelope["message_id"] == sent
        await asyncio.sleep(3.5)
        await producer.advance([AdvanceItem(handle, AdvanceOutcome(acked=1, failed=0, rejected=0))])
        # The ACK goes out in the background: its refusal is counted once it is answered.
        await eventually(lambda: producer.lost_locks, lambda n: n == 1, timeout=10, what="lock lost")
        raw, handle = await asyncio.wait_for(anext(stream), timeout=10)
        assert (raw.envelope["message_id"], raw.envelope["delivery_count"]) == (sent, 1)
        await producer.advance([AdvanceItem(handle, AdvanceOutcome(acked=1, failed=0, rejected=0))])
        await eventually(lambda: servicebus.messages(queue), lambda m: m == [], timeout=10, what="completed")
    finally:
        await stream.aclose()
        await producer.aclose()


async def test_topic_subscription_is_a_stream(servicebus, servicebus_connection, harness):
    topic = servicebus.create_topic()
    first, second = servicebus.create_subscription(topic), servicebus.create_subscription(topic)
    one = harness.add(ServiceBusSharedStreamTrigger(topic_name=topic, subscription_name=first))
    two = harness.add(ServiceBusSharedStreamTrigger(topic_name=topic, subscription_name=second))
    sent = servicebus.send(topic, [{"n": i} for i in range(4)])
    await one.wait_for_events(4)
    await two.wait_for_events(4)
    assert len(harness.manager._groups) == 2  # a subscription is its own upstream
    assert sorted(ids_of(one)) == sorted(ids_of(two)) == sorted(sent)
    assert one.payloads[0]["entity"] == f"{topic}/Subscriptions/{first}"
    for sub in (first, second):
        path = f"{topic}/Subscriptions/{sub}"
        await eventually(
            lambda p=path: servicebus.messages(p), lambda m: m == [], timeout=20, what="completed"
        )


async def test_a_session_wait_that_times_out_is_not_held_as_a_session(servicebus, servicebus_connection):
    """
    Regression: with one session busy, the producer filled its other session slots with phantoms.

    When no session is free, Service Bus answers a next-available-session attach and then refuses
    it (``com.microsoft:timeout``); the SDK can hand that receiver back as if it held a session
    (its ``session_id`` still the NEXT_AVAILABLE filter). Kept as sessions, the phantoms cost the
    receive loop a wait each, so a real session was read less often than its lock lasted: its lock
    ran out, its redelivered message bounced between lock losses and never came back in time.
    """
    queue = servicebus.create_queue(requires_session=True, lock_duration=5)
    sent = servicebus.send(queue, [{"n": 1}, {"n": 2}], session_id="g")
    producer = ServiceBusSharedStreamProducer(
        queue_name=queue,
        azure_service_bus_conn_id=servicebus_connection,
        max_in_flight=10,
        max_wait_time=1,
        session_enabled=True,
    )
    stream = producer.open_stream()
    try:
        held = [await anext(stream), await anext(stream)]
        assert [raw.envelope["session_id"] for raw, _ in held] == ["g", "g"]
        await producer.advance([AdvanceItem(handle, AdvanceOutcome(0, 1, 0)) for _, handle in held])
        again = [await asyncio.wait_for(anext(stream), timeout=20) for _ in sent]
        # Only the session's first message is abandoned (one delivery counted); the later one comes
        # back uncounted when the session is given up (docs/servicebus.rst, sessions).
        assert sorted(
            (raw.envelope["message_id"], raw.envelope["delivery_count"]) for raw, _ in again
        ) == sorted([(sent[0], 1), (sent[1], 0)])
        assert producer.lost_locks == 0, "the session lock ran out while the producer held the session"
        assert producer.held_sessions() == ["g"]
        await producer.advance([AdvanceItem(handle, AdvanceOutcome(1, 0, 0)) for _, handle in again])
        assert servicebus.messages(queue) == []
    finally:
        await stream.aclose()
        await producer.aclose()
