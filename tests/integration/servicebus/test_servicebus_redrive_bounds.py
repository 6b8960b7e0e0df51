"""
Service Bus redrive bound on the AMQP test server (issue 45 item 1).

The snapshot is the time the redrive started: a dead letter enqueued after it (a copy a watcher
rejected again) is held and given back at the end, never chased.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from airflow_shared_stream.common.redrive import RedriveItem, redrive
from tests.integration.servicebus.conftest import KEY_NAME, SAS_KEY
from tests.integration.servicebus.test_servicebus_redrive import dead_lettered, source
from tests.support.servicebus_server import ServiceBusServer


def reject_again(servicebus: ServiceBusServer, queue: str, count: int) -> None:
    """Receive ``count`` copies from ``queue`` and dead-letter them, as a rejecting watcher does."""
    from azure.servicebus import ServiceBusClient

    connection_string = servicebus.connection_string(key_name=KEY_NAME, key=SAS_KEY)
    client = ServiceBusClient.from_connection_string(connection_string)
    with client, client.get_queue_receiver(queue) as receiver:
        left = count
        while left:
            for message in receiver.receive_messages(max_message_count=left, max_wait_time=5):
                receiver.dead_letter_message(message, reason="rejected", error_description="again")
                left -= 1


async def test_a_service_bus_redrive_never_chases_its_own_copies(
    servicebus: ServiceBusServer, servicebus_connection: str
) -> None:
    queue = servicebus.create_queue()
    dead_lettered(servicebus, queue, queue, 6)

    async def rejected_again(step: str, items: Sequence[RedriveItem]) -> None:
        if step == "copied" and items:
            await asyncio.to_thread(reject_again, servicebus, queue, len(items))

    summary = await redrive(source(queue), max_messages=50, checkpoint=rejected_again, batch_size=2)

    assert summary.moved == 6  # not one copy chased
    assert len(servicebus.dead_letters(queue)) == 6  # the copies that came back: the next one's
    assert (summary.examined, summary.left) == (6, 0)
