"""A real SQS API on loopback: moto's HTTP server, started once per test session."""

from __future__ import annotations

import json
import sys
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest

from tests.support.brokers import SqsServer, sqs_server_process
from tests.support.processes import free_port, running, wait_for_port

REGION = "us-east-1"
ACCESS_KEY = "AKIDSHAREDSTREAMTEST"
SECRET_KEY = "s3cr3t-never-in-logs-8d1f2"


@pytest.fixture(scope="session")
def sqs() -> Iterator[SqsServer]:
    try:
        server = sqs_server_process(region=REGION, access_key=ACCESS_KEY, secret_key=SECRET_KEY)
        running = server.__enter__()
    except RuntimeError as exc:
        raise RuntimeError(f"the SQS test broker (moto) could not start: {exc}") from exc
    try:
        yield running
    finally:
        server.__exit__(None, None, None)


@pytest.fixture
def aws_connection(sqs: SqsServer, monkeypatch: pytest.MonkeyPatch) -> str:
    """``aws_default`` pointing at moto, in the Amazon provider's connection format."""
    monkeypatch.setenv("AIRFLOW_CONN_AWS_DEFAULT", json.dumps(sqs.connection()))
    return "aws_default"


@pytest.fixture
async def harness() -> AsyncIterator[Any]:
    from airflow_shared_stream.testing import SharedStreamHarness

    async with SharedStreamHarness(confirm_after=0.0) as h:
        yield h


@pytest.fixture(scope="session")
def authenticating_sqs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A second moto server that checks credentials against its own IAM (none are known): its URL."""
    port = free_port()
    log = tmp_path_factory.mktemp("moto-auth") / "moto.log"
    argv = [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)]
    with running(argv, log_path=log, env={"INITIAL_NO_AUTH_ACTION_COUNT": "0"}) as proc:
        wait_for_port(port, timeout=60, proc=proc, what="authenticating moto server")
        yield f"http://127.0.0.1:{port}"
