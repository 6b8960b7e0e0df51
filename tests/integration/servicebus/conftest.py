"""The Service Bus test server (a protocol-level fake on python-qpid-proton), once per session."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest

from tests.support.servicebus_server import ServiceBusServer

KEY_NAME = "RootManageSharedAccessKey"
SAS_KEY = "c2FzLWtleS1uZXZlci1pbi1sb2dzLTkzN2E="


@pytest.fixture(scope="session")
def servicebus() -> Iterator[ServiceBusServer]:
    """One fake namespace for the session; it checks SAS signatures against ``SAS_KEY``."""
    server = ServiceBusServer(sas_keys={KEY_NAME: SAS_KEY})
    try:
        server.start()
    except Exception as exc:
        raise RuntimeError(f"the Service Bus test server (proton) could not start: {exc}") from exc
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def servicebus_connection(servicebus: ServiceBusServer, monkeypatch: pytest.MonkeyPatch) -> str:
    """``azure_service_bus_default`` as the Azure provider stores it: the connection string in schema."""
    connection = servicebus.connection(key_name=KEY_NAME, key=SAS_KEY)
    monkeypatch.setenv("AIRFLOW_CONN_AZURE_SERVICE_BUS_DEFAULT", json.dumps(connection))
    return "azure_service_bus_default"


@pytest.fixture
async def harness() -> AsyncIterator[Any]:
    from airflow_shared_stream.testing import SharedStreamHarness

    async with SharedStreamHarness(confirm_after=0.0) as h:
        yield h
