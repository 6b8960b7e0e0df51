"""
Google's Pub/Sub emulator, started once per test session (tests/support/pubsub_emulator.py).

A machine without the emulator fails these tests with a message naming the package to install;
they never skip. Each test makes its own topics and subscriptions, so tests never share messages.
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.pubsub_emulator import PubSubEmulator, pubsub_emulator_process


@pytest.fixture(scope="session")
def pubsub_emulator() -> Iterator[PubSubEmulator]:
    data_dir = Path(tempfile.mkdtemp(prefix="pubsub-emulator-"))
    with pubsub_emulator_process(data_dir) as emulator:
        yield emulator


@pytest.fixture
def pubsub(pubsub_emulator: PubSubEmulator, monkeypatch: pytest.MonkeyPatch) -> PubSubEmulator:
    """
    The emulator, with the code under test pointed at it as a deployment would be.

    ``PUBSUB_EMULATOR_HOST`` for the process, and ``google_cloud_default`` as a
    ``google_cloud_platform`` connection naming the emulator's project (no key: the emulator
    takes none, and the hook must not look for one when the emulator is in use).
    """
    monkeypatch.setenv("PUBSUB_EMULATOR_HOST", pubsub_emulator.host)
    monkeypatch.setenv("AIRFLOW_CONN_GOOGLE_CLOUD_DEFAULT", json.dumps(pubsub_emulator.connection()))
    return pubsub_emulator


@pytest.fixture(scope="session")
def pubsub_service_standin() -> Iterator[PubSubEmulator]:
    """The stand-in that behaves as the service documents where the emulator does not (FIDELITY.md)."""
    from tests.support.pubsub_service import pubsub_service_process

    with pubsub_service_process() as standin:
        yield standin


@pytest.fixture
def pubsub_service(pubsub_service_standin: PubSubEmulator, monkeypatch: pytest.MonkeyPatch) -> PubSubEmulator:
    """The stand-in, with the code under test pointed at it as at the emulator (see ``pubsub``)."""
    monkeypatch.setenv("PUBSUB_EMULATOR_HOST", pubsub_service_standin.host)
    monkeypatch.setenv("AIRFLOW_CONN_GOOGLE_CLOUD_DEFAULT", json.dumps(pubsub_service_standin.connection()))
    return pubsub_service_standin


@pytest.fixture
async def harness() -> AsyncIterator[Any]:
    from airflow_shared_stream.testing import SharedStreamHarness

    async with SharedStreamHarness(confirm_after=0.0) as h:
        yield h


@pytest.fixture(scope="session")
def refusing_pubsub() -> Iterator[str]:
    """
    A gRPC endpoint that refuses every call as unauthenticated: its ``host:port``.

    The emulator takes any credential, so it cannot refuse one; the real service answers a call
    with a bad key ``UNAUTHENTICATED``, which is all this endpoint does.
    """
    from concurrent import futures

    import grpc

    def refuse(request: bytes, context: grpc.ServicerContext) -> bytes:
        context.abort(grpc.StatusCode.UNAUTHENTICATED, "Request had invalid authentication credentials.")
        raise AssertionError("abort returns only by raising")

    class RefuseEverything(grpc.GenericRpcHandler):
        def service(self, handler_call_details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler:
            return grpc.unary_unary_rpc_method_handler(refuse)

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2), options=[("grpc.so_reuseport", 0)])
    server.add_generic_rpc_handlers((RefuseEverything(),))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        yield f"127.0.0.1:{port}"
    finally:
        server.stop(grace=None)
