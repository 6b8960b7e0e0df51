"""
The Streams page's Service Bus dead-letter depth on the AMQP test server: the ``$deadletterqueue``
sub-queue counted by peeking, which neither locks a message nor counts as a delivery.
"""

from __future__ import annotations

from typing import Any

import pytest

from airflow_shared_stream.common.redrive import redrive
from airflow_shared_stream.console import backlog
from airflow_shared_stream.console.backlog import read_depth
from airflow_shared_stream.redrive import dead_letter_source
from airflow_shared_stream.servicebus import operations
from tests.integration.servicebus.test_servicebus_redrive import dead_lettered
from tests.support.servicebus_server import ServiceBusServer

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


async def servicebus_dead_letter_depth(conn_id: str, entity_path: str) -> dict[str, Any]:
    """The depth the Streams page shows: the broker's count, read as the page reads it."""
    return await read_depth(operations.dead_letter_depth(conn_id, entity_path))


@pytest.fixture(autouse=True)
def uncached(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(backlog, "CACHE_SECONDS", 0.0)  # every read asks the broker


async def test_a_queues_dead_letters_are_counted_and_left_as_they_were(
    servicebus: ServiceBusServer, servicebus_connection: str
) -> None:
    queue = servicebus.create_queue()
    assert await servicebus_dead_letter_depth(servicebus_connection, queue) == {"depth": 0, "at_least": False}
    dead_lettered(servicebus, queue, queue, 7)
    locked_before = servicebus.locked_deliveries

    assert await servicebus_dead_letter_depth(servicebus_connection, queue) == {"depth": 7, "at_least": False}
    assert servicebus.locked_deliveries == locked_before  # no lock taken, no delivery counted
    # Counting locked nothing: a redrive at once takes all seven.
    summary = await redrive(dead_letter_source("servicebus", source=queue))
    assert summary.moved == 7
    assert await servicebus_dead_letter_depth(servicebus_connection, queue) == {"depth": 0, "at_least": False}


async def test_a_subscriptions_dead_letters_are_its_own_and_counted_up_to_the_limit(
    servicebus: ServiceBusServer, servicebus_connection: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    topic = servicebus.create_topic()
    failing, other = servicebus.create_subscription(topic), servicebus.create_subscription(topic)
    dead_lettered(servicebus, topic, f"{topic}/Subscriptions/{failing}", 5)

    entity = f"{topic}/Subscriptions/{failing}"
    assert await servicebus_dead_letter_depth(servicebus_connection, entity) == {
        "depth": 5,
        "at_least": False,
    }
    assert (await servicebus_dead_letter_depth(servicebus_connection, f"{topic}/Subscriptions/{other}"))[
        "depth"
    ] == 0
    monkeypatch.setattr(operations, "PEEK_LIMIT", 4)
    monkeypatch.setattr(operations, "PEEK_BATCH", 3)
    assert await servicebus_dead_letter_depth(servicebus_connection, entity) == {"depth": 4, "at_least": True}
