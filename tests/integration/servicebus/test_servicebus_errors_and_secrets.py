"""Bad input fails the watcher with an error naming the problem, and never quotes a secret."""

from __future__ import annotations

import json
import socket

import pytest

from airflow_shared_stream.servicebus import (
    ServiceBusConfigurationError,
    ServiceBusEndpointError,
    ServiceBusSharedStreamTrigger,
)
from tests.integration.servicebus.conftest import SAS_KEY

pytestmark = pytest.mark.integration


def use_connection(monkeypatch, conn: dict) -> None:
    monkeypatch.setenv("AIRFLOW_CONN_AZURE_SERVICE_BUS_DEFAULT", json.dumps(conn))


async def failure(harness, trigger) -> BaseException:
    watcher = harness.add(trigger)
    return await watcher.wait_for_error(timeout=60)


def assert_no_secret(error: BaseException, caplog, *secrets: str) -> None:
    text = f"{error} {error!r} " + " ".join(r.getMessage() for r in caplog.records)
    for secret in secrets:
        assert secret not in text


async def test_bad_connection_string(servicebus, monkeypatch, harness, caplog):
    bad = f"Endpoint=nonsense;SharedAccessKey={SAS_KEY}"
    use_connection(monkeypatch, {"conn_type": "azure_service_bus", "schema": bad})
    error = await failure(harness, ServiceBusSharedStreamTrigger(servicebus.create_queue()))
    assert isinstance(error, ServiceBusConfigurationError)
    assert "not a Service Bus connection string" in str(error)
    assert_no_secret(error, caplog, SAS_KEY, bad)


def free_port_reading_like_401() -> int:
    """A free port whose number contains "401" (40100-40199), as an SDK error message quotes it."""
    for port in range(40100, 40200):
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError("no free port in 40100-40199")


async def test_an_unreachable_namespace_on_a_port_reading_401_is_not_a_refused_credential(
    monkeypatch, harness, caplog
):
    """
    Regression: a refused connection to 127.0.0.1:54011 was reported as a refused credential,
    because "401" appeared in the error text (a CI run picked that port). Any other port is the
    contract's (ConnectionContract).
    """
    port = free_port_reading_like_401
    conn = {
        "conn_type": "azure_service_bus",
        "schema": f"Endpoint=sb://127.0.0.1:{port()};SharedAccessKeyName=k;"
        f"SharedAccessKey={SAS_KEY};UseDevelopmentEmulator=true;",
    }
    use_connection(monkeypatch, conn)
    error = await failure(harness, ServiceBusSharedStreamTrigger("orders"))
    assert isinstance(error, ServiceBusEndpointError), error
    assert "did not answer as Service Bus" in str(error)
    assert_no_secret(error, caplog, SAS_KEY)
