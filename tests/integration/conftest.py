"""Fixtures every broker's integration tests share."""

from __future__ import annotations

import sys
from collections.abc import Iterator

import pytest

from tests.support.processes import free_port, running, wait_for_port
from tests.support.statsd import statsd

__all__ = ["authenticating_sqs", "statsd"]


@pytest.fixture(scope="session")
def authenticating_sqs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """
    A moto server that checks credentials against its own IAM (none are known): its URL. The SQS
    adapter's refused credentials (the contract and the secret-sentinel test) point here.
    """
    port = free_port()
    log = tmp_path_factory.mktemp("moto-auth") / "moto.log"
    argv = [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)]
    with running(argv, log_path=log, env={"INITIAL_NO_AUTH_ACTION_COUNT": "0"}) as proc:
        wait_for_port(port, timeout=60, proc=proc, what="authenticating moto server")
        yield f"http://127.0.0.1:{port}"
