"""
The Streams page's Service Bus dead-letter depth: the entity's ``dead_letter_message_count``, read
from the namespace's HTTPS/ATOM management endpoint as the service offers it (one GET, no message
read); the development emulator's connection string, whose endpoint does not answer it, falls back
to peeking the ``$deadletterqueue``, which neither locks a message nor counts as a delivery.
"""

from __future__ import annotations

import json
import logging
import socket
from collections.abc import Iterator
from typing import Any

import pytest
from azure.servicebus import ServiceBusClient, ServiceBusSubQueue

from airflow_shared_stream.common.redrive import redrive
from airflow_shared_stream.console import backlog
from airflow_shared_stream.console.backlog import read_depth
from airflow_shared_stream.redrive import dead_letter_source
from airflow_shared_stream.servicebus import operations
from tests.integration.servicebus.conftest import KEY_NAME, SAS_KEY
from tests.integration.servicebus.test_servicebus_redrive import dead_lettered
from tests.support.servicebus_management import trust_test_certificate
from tests.support.servicebus_server import ServiceBusServer

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


async def servicebus_dead_letter_depth(conn_id: str, entity_path: str) -> dict[str, Any]:
    """The depth the Streams page shows: the broker's count, read as the page reads it."""
    return await read_depth(operations.dead_letter_depth(conn_id, entity_path))


@pytest.fixture(autouse=True)
def uncached(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(backlog, "CACHE_SECONDS", 0.0)  # every read asks the broker


@pytest.fixture(scope="module")
def namespace() -> Iterator[ServiceBusServer]:
    """A test server that also answers the management endpoint, on its one port, over TLS."""
    trust_test_certificate()
    server = ServiceBusServer(sas_keys={KEY_NAME: SAS_KEY}, management=True)
    try:
        server.start()
    except Exception as exc:
        raise RuntimeError(f"the Service Bus test server (proton) could not start: {exc}") from exc
    try:
        yield server
    finally:
        server.stop()


def use(monkeypatch: pytest.MonkeyPatch, connection: dict[str, Any]) -> str:
    monkeypatch.setenv("AIRFLOW_CONN_AZURE_SERVICE_BUS_DEFAULT", json.dumps(connection))
    return "azure_service_bus_default"


@pytest.fixture
def namespace_connection(namespace: ServiceBusServer, monkeypatch: pytest.MonkeyPatch) -> str:
    return use(monkeypatch, namespace.connection(key_name=KEY_NAME, key=SAS_KEY))


async def test_a_queues_dead_letters_are_counted_by_one_management_call_reading_no_message(
    namespace: ServiceBusServer, namespace_connection: str
) -> None:
    queue = namespace.create_queue()
    assert await servicebus_dead_letter_depth(namespace_connection, queue) == {"depth": 0, "at_least": False}
    dead_lettered(namespace, queue, queue, 7)
    requests_before, locked_before = dict(namespace.requests), namespace.locked_deliveries

    assert await servicebus_dead_letter_depth(namespace_connection, queue) == {"depth": 7, "at_least": False}
    asked = {k: v - requests_before.get(k, 0) for k, v in namespace.requests.items()}
    # One GET of the runtime properties; no AMQP connection, no peek, no message read.
    assert {k: v for k, v in asked.items() if v} == {"management GET": 1}
    assert namespace.locked_deliveries == locked_before
    # A dead letter a reader holds locked is still in the sub-queue, and in its count.
    connection_string = namespace.connection_string(key_name=KEY_NAME, key=SAS_KEY)
    with (
        ServiceBusClient.from_connection_string(connection_string) as client,
        client.get_queue_receiver(queue, sub_queue=ServiceBusSubQueue.DEAD_LETTER) as receiver,
    ):
        held = receiver.receive_messages(max_message_count=3, max_wait_time=5)
        assert held
        assert await servicebus_dead_letter_depth(namespace_connection, queue) == {
            "depth": 7,
            "at_least": False,
        }
        for message in held:
            receiver.abandon_message(message)
    summary = await redrive(dead_letter_source("servicebus", source=queue))
    assert summary.moved == 7
    assert await servicebus_dead_letter_depth(namespace_connection, queue) == {"depth": 0, "at_least": False}


async def test_a_subscriptions_dead_letter_count_is_its_own_and_not_capped(
    namespace: ServiceBusServer, namespace_connection: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    topic = namespace.create_topic()
    failing, other = namespace.create_subscription(topic), namespace.create_subscription(topic)
    entity = f"{topic}/Subscriptions/{failing}"
    dead_lettered(namespace, topic, entity, 5)
    peeks_before = namespace.requests["$management"]
    monkeypatch.setattr(operations, "PEEK_LIMIT", 4)  # the count is the service's, not a peek's

    assert await servicebus_dead_letter_depth(namespace_connection, entity) == {"depth": 5, "at_least": False}
    other_entity = f"{topic}/Subscriptions/{other}"
    assert await servicebus_dead_letter_depth(namespace_connection, other_entity) == {
        "depth": 0,
        "at_least": False,
    }
    assert namespace.requests["$management"] == peeks_before  # never peeked


async def test_a_refused_signature_is_reported_by_type_without_the_key(
    namespace: ServiceBusServer, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    queue = namespace.create_queue()
    wrong_key = "d3Jvbmcta2V5LW5ldmVyLWluLWxvZ3MtNDI="
    conn_id = use(monkeypatch, namespace.connection(key_name=KEY_NAME, key=wrong_key))
    with caplog.at_level(logging.DEBUG):
        answer = await servicebus_dead_letter_depth(conn_id, queue)
    assert list(answer) == ["error"]  # refused by the management endpoint, then by AMQP's $cbs
    assert wrong_key not in caplog.text
    assert SAS_KEY not in caplog.text


async def test_a_connection_that_may_listen_but_not_manage_is_counted_by_peeking(
    namespace: ServiceBusServer, namespace_connection: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The service refuses the management GET to a SAS rule without Manage: the depth is peeked."""
    queue = namespace.create_queue()
    dead_lettered(namespace, queue, queue, 3)
    monkeypatch.setattr(namespace, "manage_keys", set())
    refused_before = namespace.requests["management GET refused"]
    peeks_before, locked_before = namespace.requests["$management"], namespace.locked_deliveries

    assert await servicebus_dead_letter_depth(namespace_connection, queue) == {"depth": 3, "at_least": False}
    assert namespace.requests["management GET refused"] == refused_before + 1
    assert namespace.requests["$management"] > peeks_before
    assert namespace.locked_deliveries == locked_before


async def test_a_namespace_whose_management_endpoint_does_not_answer_is_an_error_not_a_peek(
    servicebus: ServiceBusServer, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Only the emulator's connection string falls back: a namespace's silence is reported."""
    queue = servicebus.create_queue()
    dead_lettered(servicebus, queue, queue, 2)
    peeks_before = servicebus.requests["$management"]
    conn_id = use(
        monkeypatch,
        {
            "conn_type": "azure_service_bus",
            "schema": f"Endpoint=sb://127.0.0.1:{servicebus.port}/;"
            f"SharedAccessKeyName={KEY_NAME};SharedAccessKey={SAS_KEY}",
        },
    )
    with caplog.at_level(logging.DEBUG):
        answer = await servicebus_dead_letter_depth(conn_id, queue)
    assert answer in ({"error": "ServiceRequestError"}, {"error": "ServiceResponseError"})
    assert servicebus.requests["$management"] == peeks_before
    assert SAS_KEY not in caplog.text


async def test_the_emulators_connection_falls_back_to_peeking_up_to_the_limit(
    servicebus: ServiceBusServer, servicebus_connection: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The AMQP-only server, as the emulator's connection string reaches it: counted by peeking."""
    topic = servicebus.create_topic()
    failing, other = servicebus.create_subscription(topic), servicebus.create_subscription(topic)
    entity = f"{topic}/Subscriptions/{failing}"
    dead_lettered(servicebus, topic, entity, 5)
    locked_before, peeks_before = servicebus.locked_deliveries, servicebus.requests["$management"]

    assert await servicebus_dead_letter_depth(servicebus_connection, entity) == {
        "depth": 5,
        "at_least": False,
    }
    assert servicebus.requests["$management"] > peeks_before  # it peeked
    assert servicebus.locked_deliveries == locked_before  # and locked nothing
    other_entity = f"{topic}/Subscriptions/{other}"
    assert (await servicebus_dead_letter_depth(servicebus_connection, other_entity))["depth"] == 0
    monkeypatch.setattr(operations, "PEEK_LIMIT", 4)
    monkeypatch.setattr(operations, "PEEK_BATCH", 3)
    assert await servicebus_dead_letter_depth(servicebus_connection, entity) == {"depth": 4, "at_least": True}
    queue = servicebus.create_queue()
    dead_lettered(servicebus, queue, queue, 2)
    servicebus.send(queue, ["waiting, not dead"])
    locked_before = servicebus.locked_deliveries
    assert await servicebus_dead_letter_depth(servicebus_connection, queue) == {"depth": 2, "at_least": False}
    assert servicebus.locked_deliveries == locked_before


async def test_a_connection_string_naming_a_second_host_sends_its_signature_nowhere(
    namespace: ServiceBusServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """
    FAULT_MODEL 12 (secrets). The provider resolves a connection string's namespace with the SDK's
    public parser, which reads the ``Endpoint`` key as written; the SDK's clients (the management
    client of the depth, the AMQP client of a stream) read ``endpoint`` and ``HostName`` in any
    case, the last one winning. A string naming two hosts showed one namespace on the page while
    the management GET, signed with the key, went to the other. It is refused, before any client
    is built: nothing reaches either host.
    """
    queue = namespace.create_queue()
    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))
        shown_port = unused.getsockname()[1]
    before = {k: v for k, v in namespace.requests.items() if v}
    for second in (f"HostName=sb://127.0.0.1:{namespace.port}", f"endpoint=sb://127.0.0.1:{namespace.port}/"):
        conn_id = use(
            monkeypatch,
            {
                "conn_type": "azure_service_bus",
                "schema": f"Endpoint=sb://127.0.0.1:{shown_port}/;SharedAccessKeyName={KEY_NAME};"
                f"SharedAccessKey={SAS_KEY};UseDevelopmentEmulator=true;{second}",
            },
        )
        assert await servicebus_dead_letter_depth(conn_id, queue) == {"error": "ServiceBusConfigurationError"}
        assert {k: v for k, v in namespace.requests.items() if v} == before  # no signed GET, no AMQP


async def test_a_namespaces_count_is_asked_of_its_https_port_not_the_port_its_endpoint_names(
    namespace: ServiceBusServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """
    FAULT_MODEL 15/16 (real behaviour) and 12. Over TLS the SDK's AMQP client reaches a namespace
    on 5671 whatever port its ``Endpoint`` names, and the provider resolves
    ``sb://ns.servicebus.windows.net:5671/`` to ``ns.servicebus.windows.net``; the service answers
    its management endpoint on HTTPS 443 only. The management client kept the endpoint's port, so
    a working stream spelled with ``:5671`` showed an error for its depth, and a signed GET went
    to a port the namespace does not serve HTTPS on. Here the endpoint names the test server's
    port (which also answers HTTPS): the count must not be asked of it, since it is not the
    namespace's 443 (nothing listens on 127.0.0.1:443 here, so the depth is an error).
    """
    queue = namespace.create_queue()
    dead_lettered(namespace, queue, queue, 2)
    gets_before = namespace.requests["management GET"]
    conn_id = use(
        monkeypatch,
        {
            "conn_type": "azure_service_bus",
            "schema": f"Endpoint=sb://127.0.0.1:{namespace.port}/;"
            f"SharedAccessKeyName={KEY_NAME};SharedAccessKey={SAS_KEY}",
        },
    )
    answer = await servicebus_dead_letter_depth(conn_id, queue)
    assert namespace.requests["management GET"] == gets_before
    assert list(answer) == ["error"]


async def test_a_shared_access_signature_cannot_name_another_host_for_the_count(
    namespace: ServiceBusServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """
    FAULT_MODEL 12. A shared access signature (``extra.credential``) reaches the management client
    inside a ``SharedAccessSignature=`` connection string built around the resolved namespace; a
    signature holding ``;Endpoint=sb://<other>/`` (a pasted connection string) named another host,
    and the GET carrying the token went there while the stream's AMQP client went to the
    namespace. A signature with ``;`` is not a signature: it is refused before anything is sent.
    """
    queue = namespace.create_queue()
    before = {k: v for k, v in namespace.requests.items() if v}
    conn_id = use(
        monkeypatch,
        {
            "conn_type": "azure_service_bus",
            "extra": {
                "fully_qualified_namespace": "127.0.0.1",
                "credential": "SharedAccessSignature sr=sb%3A%2F%2F127.0.0.1&sig=c2lnbmF0dXJl&se=9999999999"
                f"&skn={KEY_NAME};Endpoint=sb://127.0.0.1:{namespace.port}/",
            },
        },
    )
    answer = await servicebus_dead_letter_depth(conn_id, queue)
    assert {k: v for k, v in namespace.requests.items() if v} == before  # the token reached no other host
    assert answer == {"error": "ServiceBusConfigurationError"}
