"""Every spelling of one Service Bus namespace and entity is one stream key (docs/concepts.rst)."""

from __future__ import annotations

import json

import pytest

from airflow_shared_stream.common.trigger import ConnectionEndpoints
from airflow_shared_stream.servicebus import ServiceBusConfigurationError, ServiceBusSharedStreamTrigger
from airflow_shared_stream.servicebus.hook import normalise_namespace, parse_connection_string

KEY = "SharedAccessKeyName=k;SharedAccessKey=c2VjcmV0"
EMULATOR = "UseDevelopmentEmulator=true"


@pytest.mark.parametrize(
    "spelling",
    [
        "ns.servicebus.windows.net",
        "NS.ServiceBus.Windows.Net",
        "ns.servicebus.windows.net:5671",  # AMQPS: the SDK drops any port over TLS
        "ns.servicebus.windows.net:443",  # WebSockets, as ARM spells endpoints
    ],
)
def test_a_real_namespace_is_its_host_in_lower_case(spelling):
    assert normalise_namespace(spelling, emulator=False) == "ns.servicebus.windows.net"


@pytest.mark.parametrize("spelling", ["localhost", "LOCALHOST", "localhost:5672", "LocalHost:5672"])
def test_the_emulator_default_port_is_spelled_out(spelling):
    assert normalise_namespace(spelling, emulator=True) == "localhost:5672"


def test_what_names_another_endpoint_stays_apart():
    assert normalise_namespace("localhost:5999", emulator=True) == "localhost:5999"
    assert normalise_namespace("localhost", emulator=True) != normalise_namespace("localhost", emulator=False)
    # No DNS: two host names are two spellings the key cannot prove equal.
    assert normalise_namespace("127.0.0.1", emulator=True) != normalise_namespace("localhost", emulator=True)
    assert normalise_namespace("[::1]:5999", emulator=True) == "[::1]:5999"


@pytest.mark.parametrize(
    "endpoint",
    [
        "Endpoint=sb://ns.servicebus.windows.net/",
        "Endpoint=sb://NS.servicebus.windows.net",
        "Endpoint=SB://ns.servicebus.windows.net:5671/",
        "Endpoint=amqps://ns.servicebus.windows.net:443/",
    ],
)
def test_connection_string_spellings_resolve_to_one_namespace(endpoint):
    assert parse_connection_string(f"{endpoint};{KEY}", "sb") == "ns.servicebus.windows.net"


@pytest.mark.parametrize("endpoint", ["sb://localhost", "sb://localhost:5672", "sb://LOCALHOST:5672/"])
def test_emulator_connection_strings_resolve_to_one_namespace(endpoint):
    assert parse_connection_string(f"Endpoint={endpoint};{KEY};{EMULATOR};", "sb") == "localhost:5672"


def define(monkeypatch: pytest.MonkeyPatch, conn_id: str, **connection: object) -> str:
    monkeypatch.setenv(
        f"AIRFLOW_CONN_{conn_id.upper()}", json.dumps({"conn_type": "azure_service_bus", **connection})
    )
    return conn_id


def key(queue: str, conn_id: str) -> object:
    return ServiceBusSharedStreamTrigger(queue, azure_service_bus_conn_id=conn_id).shared_stream_key()


def test_two_connections_naming_one_namespace_are_one_stream(monkeypatch):
    plain = define(monkeypatch, "sb_plain", schema=f"Endpoint=sb://localhost;{KEY};{EMULATOR};")
    port = define(monkeypatch, "sb_port", schema=f"Endpoint=sb://localhost:5672/;{KEY};{EMULATOR};")
    expected = ("airflow_shared_stream.servicebus", "localhost:5672", "orders")
    assert key("orders", plain) == key("Orders", port) == expected


def test_a_connection_string_and_a_namespace_are_one_stream(monkeypatch):
    string = define(monkeypatch, "sb_string", schema=f"Endpoint=sb://NS.servicebus.windows.net/;{KEY}")
    namespace = define(
        monkeypatch, "sb_namespace", extra={"fully_qualified_namespace": "ns.servicebus.windows.net:5671"}
    )
    assert key("orders", string) == key("orders", namespace)


def test_two_namespaces_are_two_streams(monkeypatch):
    one = define(monkeypatch, "sb_one", schema=f"Endpoint=sb://one.servicebus.windows.net/;{KEY}")
    two = define(monkeypatch, "sb_two", schema=f"Endpoint=sb://two.servicebus.windows.net/;{KEY}")
    assert key("orders", one) != key("orders", two)


def test_an_unreadable_connection_keys_on_its_id_and_the_stream_says_why_later():
    assert key("orders", "sb_not_defined") == (
        "airflow_shared_stream.servicebus",
        "unresolved",
        "sb_not_defined",
        "orders",
    )


def test_the_last_endpoint_read_stands_in_where_a_connection_cannot_be_read():
    """The manager's poll task cannot read connections; the key its watcher computed stands in."""
    endpoints = ConnectionEndpoints()
    assert endpoints.resolve("servicebus", "sb", lambda: "localhost:5672") == "localhost:5672"

    def unreadable() -> str:
        raise ServiceBusConfigurationError("Airflow connection 'sb' is not defined")

    assert endpoints.resolve("servicebus", "sb", unreadable) == "localhost:5672"
    assert endpoints.resolve("servicebus", "other", unreadable) is None


@pytest.mark.parametrize(
    "connection_string",
    [
        f"Endpoint=sb://ns.servicebus.windows.net/;{KEY}",
        f"Endpoint=SB://NS.servicebus.windows.net:5671/;{KEY}",
        f"Endpoint=amqps://ns.servicebus.windows.net:443/;{KEY}",
        f"Endpoint=sb://localhost;{KEY};{EMULATOR};",
        f"Endpoint=sb://LOCALHOST:5672/;{KEY};{EMULATOR};",
        f"Endpoint=sb://127.0.0.1:5999;{KEY};{EMULATOR};",
    ],
)
def test_the_stream_key_reads_the_namespace_as_the_sdk_does_without_importing_it(connection_string):
    """Issue 50: the key is computed on the triggerer's loop; the SDK's parser is imported off it."""
    plain = parse_connection_string(connection_string, "sb", with_sdk=False)
    assert plain == parse_connection_string(connection_string, "sb")


async def test_a_string_the_two_readings_disagree_on_is_refused_at_connect(monkeypatch):
    """Where the key's plain reading and the SDK's differ, the stream connects nowhere."""
    from airflow_shared_stream.servicebus import hook as hook_module
    from airflow_shared_stream.servicebus.errors import ServiceBusConfigurationError
    from airflow_shared_stream.servicebus.hook import ServiceBusSharedStreamHook

    conn_id = define(monkeypatch, "sb_two_ways", schema=f"Endpoint=sb://ns.servicebus.windows.net/;{KEY}")
    monkeypatch.setattr(hook_module, "_namespace_read_plainly", lambda *_: "elsewhere.servicebus.windows.net")
    with pytest.raises(ServiceBusConfigurationError, match="read two ways"):
        await ServiceBusSharedStreamHook(conn_id).aget_client_config()


@pytest.mark.parametrize(
    "connection_string",
    [
        f"endpoint=sb://ns.servicebus.windows.net/;{KEY}",
        f"Endpoint =sb://ns.servicebus.windows.net/;{KEY}",
        f"HostName=sb://ns.servicebus.windows.net/;{KEY}",
        f"Endpoint=ns.servicebus.windows.net;{KEY}",
        "Endpoint=sb://ns.servicebus.windows.net/;SharedAccessKeyName=k",
        "Endpoint=sb://ns.servicebus.windows.net/",
        f"Endpoint=sb://ns.servicebus.windows.net/;{KEY};SharedAccessSignature=abc",
        f"Endpoint=sb://ns.servicebus.windows.net/;{KEY};junk",
        f"Endpoint=sb://ns.servicebus.windows.net/;;{KEY}",
    ],
)
def test_the_stream_key_refuses_what_the_sdk_refuses(connection_string):
    """
    A string the SDK refuses is refused when the key is read, in its own watcher (attack on
    issue 50): refused only at connect, it failed every watcher of the stream sharing its key.
    """
    from airflow_shared_stream.servicebus.errors import ServiceBusConfigurationError

    with pytest.raises(ServiceBusConfigurationError):
        parse_connection_string(connection_string, "sb")
    with pytest.raises(ServiceBusConfigurationError, match="not a Service Bus connection string"):
        parse_connection_string(connection_string, "sb", with_sdk=False)
