"""
Dead-letter redrive on the AMQP Service Bus test server (tests/support/servicebus_server.py).

Messages reach the ``$deadletterqueue`` sub-queue the way our triggers put them there: received
with a peek-lock and dead-lettered with a reason and description, through the real SDK.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from airflow_shared_stream.common.redrive import redrive
from airflow_shared_stream.redrive import dead_letter_source
from airflow_shared_stream.servicebus.redrive import REDRIVE_SUBSCRIPTION_PROPERTY
from tests.integration.servicebus.conftest import KEY_NAME, SAS_KEY
from tests.support.redrive_child import kill_between_copy_and_remove
from tests.support.servicebus_server import ServiceBusServer


def dead_lettered(servicebus: ServiceBusServer, send_to: str, receive_from: str, count: int) -> list[bytes]:
    """Send ``count`` messages and dead-letter every one from ``receive_from``; return the bodies."""
    from azure.servicebus import ServiceBusClient

    bodies = [json.dumps({"n": i, "type": "a" if i % 2 else "b"}) for i in range(count)]
    servicebus.send(
        send_to,
        list(bodies),
        application_properties=lambda i: {"tenant": f"t{i}"},
        correlation_id=lambda i: f"c{i}",
        subject="order",
    )
    connection_string = servicebus.connection_string(key_name=KEY_NAME, key=SAS_KEY)
    topic, _, subscription = receive_from.partition("/Subscriptions/")
    with ServiceBusClient.from_connection_string(connection_string) as client:
        receiver = (
            client.get_subscription_receiver(topic, subscription)
            if subscription
            else client.get_queue_receiver(receive_from)
        )
        with receiver:
            left = count
            while left:
                for message in receiver.receive_messages(max_message_count=left, max_wait_time=5):
                    receiver.dead_letter_message(message, reason="rejected", error_description="no")
                    left -= 1
    assert len(servicebus.dead_letters(receive_from)) == count
    return [b.encode() for b in bodies]


def source(entity: str, **kwargs: Any) -> Any:
    return dead_letter_source("servicebus", source=entity, keep_origin_attributes=kwargs.pop("keep", False))


def numbers(messages: list[Any]) -> list[int]:
    return sorted(json.loads(m.body)["n"] for m in messages)


async def test_redrive_moves_every_message_with_its_properties(
    servicebus: ServiceBusServer, servicebus_connection: str
) -> None:
    queue = servicebus.create_queue()
    bodies = dead_lettered(servicebus, queue, queue, 12)

    summary = await redrive(source(queue))

    assert (summary.moved, summary.skipped, summary.failed) == (12, 0, 0)
    moved = servicebus.messages(queue)
    assert sorted(m.body for m in moved) == sorted(bodies)
    for message in moved:
        n = json.loads(message.body)["n"]
        properties = {str(k): v for k, v in message.application_properties.items()}
        assert properties.pop("shared_stream_original_message_id") != message.message.id  # a new id
        assert properties == {"tenant": f"t{n}"}
        assert (message.message.correlation_id, message.message.subject) == (f"c{n}", "order")
    assert servicebus.dead_letters(queue) == []


async def test_keep_origin_attributes_carries_the_dead_letter_reason(
    servicebus: ServiceBusServer, servicebus_connection: str
) -> None:
    queue = servicebus.create_queue()
    dead_lettered(servicebus, queue, queue, 2)

    await redrive(source(queue, keep=True))

    for message in servicebus.messages(queue):
        properties = {str(k): v for k, v in message.application_properties.items()}
        assert (properties["DeadLetterReason"], properties["DeadLetterErrorDescription"]) == (
            "rejected",
            "no",
        )


async def test_a_subscriptions_dead_letters_go_to_its_topic_named_for_it(
    servicebus: ServiceBusServer, servicebus_connection: str
) -> None:
    topic = servicebus.create_topic()
    failing, other = servicebus.create_subscription(topic), servicebus.create_subscription(topic)
    dead_lettered(servicebus, topic, f"{topic}/Subscriptions/{failing}", 3)
    servicebus.messages(f"{topic}/Subscriptions/{other}")  # the first copies, still there
    for stored in servicebus.messages(f"{topic}/Subscriptions/{other}"):
        assert REDRIVE_SUBSCRIPTION_PROPERTY not in {str(k) for k in stored.application_properties}

    summary = await redrive(source(f"{topic}/Subscriptions/{failing}"))

    assert summary.moved == 3
    redriven = servicebus.messages(f"{topic}/Subscriptions/{failing}")
    assert numbers(redriven) == [0, 1, 2]
    for message in redriven:
        properties = {str(k): v for k, v in message.application_properties.items()}
        assert properties[REDRIVE_SUBSCRIPTION_PROPERTY] == failing
    # A topic delivers to every subscription: the other one gets the copies too (docs/redrive.rst).
    assert len(servicebus.messages(f"{topic}/Subscriptions/{other}")) == 6


async def test_filter_moves_only_what_it_selects(
    servicebus: ServiceBusServer, servicebus_connection: str
) -> None:
    queue = servicebus.create_queue()
    dead_lettered(servicebus, queue, queue, 8)

    summary = await redrive(source(queue), filter="body.type == 'a' && application_properties.tenant != 't1'")

    assert (summary.moved, summary.skipped) == (3, 5)
    assert numbers(servicebus.messages(queue)) == [3, 5, 7]
    assert numbers(servicebus.dead_letters(queue)) == [0, 1, 2, 4, 6]


async def test_max_messages_moves_no_more(servicebus: ServiceBusServer, servicebus_connection: str) -> None:
    queue = servicebus.create_queue()
    dead_lettered(servicebus, queue, queue, 15)

    summary = await redrive(source(queue), max_messages=6)

    assert summary.moved == 6
    assert len(servicebus.messages(queue)) == 6
    assert len(servicebus.dead_letters(queue)) == 9


async def test_dry_run_changes_nothing(servicebus: ServiceBusServer, servicebus_connection: str) -> None:
    queue = servicebus.create_queue()
    dead_lettered(servicebus, queue, queue, 5)

    summary = await redrive(source(queue), dry_run=True)

    assert (summary.moved, summary.dry_run) == (5, True)
    assert sorted(s["body"]["n"] for s in summary.samples) == [0, 1, 2, 3, 4]
    assert servicebus.messages(queue) == []
    assert numbers(servicebus.dead_letters(queue)) == [0, 1, 2, 3, 4]
    assert servicebus.locked_count(f"{queue}/$DeadLetterQueue") == 0  # given back


async def test_a_redrive_killed_between_send_and_complete_loses_nothing(
    servicebus: ServiceBusServer, servicebus_connection: str
) -> None:
    queue = servicebus.create_queue()
    bodies = dead_lettered(servicebus, queue, queue, 25)

    line = await asyncio.to_thread(kill_between_copy_and_remove, "servicebus", source=queue)

    copied = int(line.split()[1])
    assert copied > 0
    at_origin = {m.body for m in servicebus.messages(queue)}
    in_dlq = {m.body for m in servicebus.dead_letters(queue)}  # locked by the dead redrive, or not
    assert len(at_origin) == copied
    assert at_origin | in_dlq == set(bodies)
    assert in_dlq == set(bodies)  # nothing was completed before the kill
