"""
Stream identity against the AMQP test server: every spelling of one entity is one stream.

The key is the entity of the namespace the connection resolves to, never the connection id
(docs/concepts.rst, "Stream identity"). On one triggerer, two spellings share one receiver and
every watcher sees every message; across triggerers, the split-stream check groups watchers by
that entity, so two connection ids with the same connection string are reported as one split
stream.
"""

from __future__ import annotations

import json
import logging

import pytest

from airflow_shared_stream.placement import report, stream_placements
from airflow_shared_stream.servicebus import ServiceBusSharedStreamTrigger
from tests.integration.servicebus.conftest import KEY_NAME, SAS_KEY
from tests.support.waiting import eventually

pytestmark = pytest.mark.integration

MESSAGES = 40
TRIGGER = "airflow_shared_stream.servicebus.trigger.ServiceBusSharedStreamTrigger"


def spellings(servicebus) -> dict[str, str]:
    """Connection id -> one spelling of the test server's namespace (one connection string twice)."""
    exact = servicebus.connection_string(key_name=KEY_NAME, key=SAS_KEY)
    respelled = exact.replace(
        f"Endpoint=sb://127.0.0.1:{servicebus.port}", f"Endpoint=SB://127.0.0.1:{servicebus.port}/"
    )
    assert respelled != exact
    return {"sb_exact": exact, "sb_same_string": exact, "sb_respelled": respelled}


@pytest.fixture
def connections(servicebus, monkeypatch) -> list[str]:
    for conn_id, connection_string in spellings(servicebus).items():
        monkeypatch.setenv(
            f"AIRFLOW_CONN_{conn_id.upper()}",
            json.dumps({"conn_type": "azure_service_bus", "schema": connection_string}),
        )
    return list(spellings(servicebus))


async def test_spellings_of_one_namespace_share_one_receiver_and_every_watcher_sees_everything(
    servicebus, connections, harness
):
    queue = servicebus.create_queue()
    watchers = [
        harness.add(ServiceBusSharedStreamTrigger(queue, azure_service_bus_conn_id=conn_id))
        for conn_id in connections
    ]
    sent = servicebus.send(queue, [{"n": i} for i in range(MESSAGES)])
    for watcher in watchers:
        await watcher.wait_for_events(MESSAGES, timeout=60)
    await eventually(lambda: servicebus.messages(queue), lambda m: m == [], timeout=30, what="all completed")
    assert len(harness.manager._groups) == 1, list(harness.manager._groups)
    for watcher in watchers:
        assert watcher.error is None, watcher.error
        assert sorted(p["message_id"] for p in watcher.payloads) == sorted(sent)


def test_the_split_stream_check_groups_two_connection_ids_of_one_entity(servicebus, connections, caplog):
    """Watchers of one queue through two connection ids on two triggerers: an ERROR naming both."""
    queue = servicebus.create_queue()
    first = {"queue_name": queue, "azure_service_bus_conn_id": "sb_exact", "match": "body.kind == 'order'"}
    second = {"queue_name": queue, "azure_service_bus_conn_id": "sb_same_string"}
    rows = [(TRIGGER, first, 1), (TRIGGER, second, 2)]
    placements = stream_placements(rows)
    assert len(placements) == 1, [p.key for p in placements]
    with caplog.at_level(logging.INFO, logger="airflow_shared_stream.placement"):
        report(placements, triggerer_id=1)
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1, errors
    assert "run on 2 triggerers" in errors[0]
    assert "'sb_exact'" in errors[0]
    assert "'sb_same_string'" in errors[0]
    assert SAS_KEY not in errors[0]


async def test_a_connection_string_the_sdk_refuses_fails_its_own_watcher_only(
    servicebus, monkeypatch, harness
):
    """
    A watcher whose connection string the SDK refuses fails alone; other watchers keep the stream.

    Issue 50 reads the stream key's namespace without the SDK and leaves the SDK's refusal to the
    stream's connect. A string naming the same namespace but missing its key (a secret not filled
    in) then shares the stream of a correct connection to that namespace: added first, its kwargs
    build the stream and the refusal fails every watcher of it, the correct connection's too;
    added second, it is silently accepted. FAULT_MODEL classes 1 and 12: a connection setting the
    client would refuse is refused for the watcher that names it, never for someone else's.
    """
    good = servicebus.connection_string(key_name=KEY_NAME, key=SAS_KEY)
    missing_key = ";".join(p for p in good.split(";") if not p.startswith("SharedAccessKey="))
    for conn_id, connection_string in (("sb_good", good), ("sb_missing_key", missing_key)):
        monkeypatch.setenv(
            f"AIRFLOW_CONN_{conn_id.upper()}",
            json.dumps({"conn_type": "azure_service_bus", "schema": connection_string}),
        )
    queue = servicebus.create_queue()
    broken = harness.add(ServiceBusSharedStreamTrigger(queue, azure_service_bus_conn_id="sb_missing_key"))
    correct = harness.add(ServiceBusSharedStreamTrigger(queue, azure_service_bus_conn_id="sb_good"))
    error = await broken.wait_for_error()
    assert "sb_missing_key" in str(error)
    assert SAS_KEY not in str(error)
    sent = servicebus.send(queue, [{"n": 1}])
    await correct.wait_for_events(1, timeout=60)
    assert correct.error is None, correct.error
    assert [p["message_id"] for p in correct.payloads] == sent
