"""A real SQS API on loopback: moto's HTTP server, started once per test session."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest

from tests.support.brokers import SqsServer, sqs_server_process

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
