"""Publish a fresh canary to each stream until every one of its watchers has fired once."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from pathlib import Path

from bench.startup_rigs import Rig
from tests.support.airflow import AirflowDeployment
from tests.support.processes import tail

CANARY_AGAIN_AFTER = 5.0
"""Seconds before a stream whose watchers have not all fired gets another canary (it may have
opened at the end of its topic after the first was sent)."""


def canary_until_each_stream_fires(
    airflow: AirflowDeployment,
    rigs: dict[str, Rig],
    waiting: Callable[[], set[str]],
    timeout: float,
    describe_load: Callable[[], str] = lambda: "",
) -> None:
    """
    ``waiting()`` names the brokers with a watcher that has no asset event yet; each gets a canary
    now and another each time :data:`CANARY_AGAIN_AFTER` passes with nothing new, until none waits.
    """
    log: Path = airflow.log_path("triggerer")
    deadline = time.monotonic() + timeout
    while still := waiting():
        assert time.monotonic() < deadline, (
            f"no canary reached every watcher of {sorted(still)} in {timeout:.0f} s{describe_load()}\n"
            f"{tail(log, 60)}"
        )
        airflow.check_alive()
        for broker in still:
            rigs[broker].publish({"canary": f"canary-{uuid.uuid4().hex[:8]}"})
        again = time.monotonic() + CANARY_AGAIN_AFTER
        while time.monotonic() < again and waiting() == still:
            time.sleep(0.2)
