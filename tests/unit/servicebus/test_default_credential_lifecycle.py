"""
A default credential the hook makes for one Service Bus client is closed with that client
(``close`` or ``async with``), for the data client and the administration client alike. Azure's
default chain is replaced by a fake (azure-identity may not be installed): this is the pure
lifecycle of what the hook builds, no namespace is reached.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from airflow_shared_stream.servicebus.hook import ServiceBusClientConfig


class FakeCredential:
    """Stands in for ``azure.identity.aio.DefaultAzureCredential``: counts its closes."""

    def __init__(self) -> None:
        self.closes = 0

    async def get_token(self, *scopes: str, **kwargs: Any) -> Any:
        raise AssertionError("no token is asked for: nothing is connected")

    async def close(self) -> None:
        self.closes += 1


@pytest.fixture
def made(monkeypatch: pytest.MonkeyPatch) -> list[FakeCredential]:
    credentials: list[FakeCredential] = []

    def default_credential(self: ServiceBusClientConfig) -> FakeCredential:
        credentials.append(FakeCredential())
        return credentials[-1]

    monkeypatch.setattr(ServiceBusClientConfig, "_default_credential", default_credential)
    return credentials


def _config() -> ServiceBusClientConfig:
    return ServiceBusClientConfig(namespace="orders.servicebus.windows.net", use_default_credential=True)


def test_closing_the_client_closes_the_credential_made_for_it(made: list[FakeCredential]) -> None:
    async def scenario() -> None:
        client = _config().make_client()
        assert made[0].closes == 0
        await client.close()
        await client.close()  # a second close closes nothing twice

    asyncio.run(scenario())
    assert [c.closes for c in made] == [1]


def test_leaving_the_administration_client_closes_the_credential_made_for_it(
    made: list[FakeCredential],
) -> None:
    async def scenario() -> None:
        async with _config().make_admin_client() as admin:
            assert callable(admin.get_queue_runtime_properties)  # the SDK client's own methods
            assert made[0].closes == 0

    asyncio.run(scenario())
    assert [c.closes for c in made] == [1]


def test_the_client_is_closed_even_if_closing_it_fails(
    made: list[FakeCredential], monkeypatch: pytest.MonkeyPatch
) -> None:
    from azure.servicebus.aio import ServiceBusClient

    async def failing_close(self: Any) -> None:
        raise RuntimeError("the connection was gone")

    monkeypatch.setattr(ServiceBusClient, "close", failing_close)

    async def scenario() -> None:
        with pytest.raises(RuntimeError):
            await _config().make_client().close()

    asyncio.run(scenario())
    assert [c.closes for c in made] == [1]
