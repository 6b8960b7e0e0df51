"""
What a Service Bus redrive sends, against the test server acting as a Standard namespace whose
entities have duplicate detection (FIDELITY.md): copies with ids of their own, in batches the
link accepts (docs/redrive.rst).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from airflow_shared_stream.common.redrive import redrive
from airflow_shared_stream.redrive import dead_letter_source
from tests.support.servicebus_server import ServiceBusServer

STANDARD_MAX_MESSAGE_BYTES = 256 * 1024
"""What a Standard namespace advertises as a send link's max-message-size (and batch size)."""


@pytest.fixture
def standard(monkeypatch: pytest.MonkeyPatch) -> Iterator[ServiceBusServer]:
    """A namespace of its own: duplicate detection on every entity, Standard's size limit."""
    server = ServiceBusServer()
    server.duplicate_detection_window = 600.0
    server.max_message_size = STANDARD_MAX_MESSAGE_BYTES
    try:
        server.start()
    except Exception as exc:
        raise RuntimeError(f"the Service Bus test server (proton) could not start: {exc}") from exc
    monkeypatch.setenv("AIRFLOW_CONN_AZURE_SERVICE_BUS_DEFAULT", json.dumps(server.connection()))
    try:
        yield server
    finally:
        server.stop()


def dead_letter_each(server: ServiceBusServer, queue: str, bodies: list[str]) -> list[str]:
    """Send each body on its own and dead-letter it as our reject does; return the message ids."""
    from azure.servicebus import ServiceBusClient

    ids = [server.send(queue, [body])[0] for body in bodies]
    client = ServiceBusClient.from_connection_string(server.connection_string())
    with client, client.get_queue_receiver(queue) as receiver:
        left = len(bodies)
        while left:
            for message in receiver.receive_messages(max_message_count=left, max_wait_time=5):
                receiver.dead_letter_message(message, reason="rejected", error_description="no")
                left -= 1
    assert len(server.dead_letters(queue)) == len(bodies)
    return ids


def source(queue: str) -> Any:
    return dead_letter_source("servicebus", source=queue)


async def test_a_redrive_on_an_entity_with_duplicate_detection_loses_nothing(
    standard: ServiceBusServer,
) -> None:
    """The original's id is in the entity's window: a copy under it would be accepted and dropped."""
    queue = standard.create_queue()
    bodies = [json.dumps({"n": n}) for n in range(5)]
    ids = dead_letter_each(standard, queue, bodies)

    summary = await redrive(source(queue))

    moved = standard.messages(queue)
    assert sorted(m.body.decode() for m in moved) == sorted(bodies)
    assert standard.dropped_duplicates == 0
    by_body = {body: id_ for body, id_ in zip(bodies, ids, strict=True)}
    for message in moved:
        original = by_body[message.body.decode()]
        assert message.application_properties["shared_stream_original_message_id"] == original
        assert message.message.id != original
    assert summary.moved == 5
    assert standard.dead_letters(queue) == []


async def test_copies_go_in_batches_the_namespace_accepts(standard: ServiceBusServer) -> None:
    """Ten copies of 150 KiB are over a Standard namespace's 256 KiB batch: one each fits."""
    queue = standard.create_queue()
    bodies = [json.dumps({"n": n, "pad": "x" * (150 * 1024)}) for n in range(10)]
    dead_letter_each(standard, queue, bodies)

    summary = await redrive(source(queue))

    assert (summary.moved, summary.failed) == (10, 0)
    assert sorted(json.loads(m.body)["n"] for m in standard.messages(queue)) == list(range(10))
    assert standard.dead_letters(queue) == []
