"""
A real ``airflow triggerer`` told to stop while its supervisor warms its Execution API up before
forking its trigger runner (issue 50, :mod:`airflow_shared_stream.execution_api_warmup`).

The warm-up's one request is answered on Airflow's ``InProcessExecutionAPI-loop`` thread while
a short-lived thread waits for it and the supervisor's main thread waits for that one, sending
the job's heartbeats (:mod:`airflow_shared_stream.warmup_heartbeat`). A SIGTERM then ends the
main thread's wait while the loop thread is still importing (anyio's modules, at the app's first
request); ``runner_fork`` keeps the signal, waits on for the request (no thread of the warm-up
alive at the fork) and sends the signal again after the fork. The import is held at a gate
(``tests.support.execution_api_gate``) so the signal lands there on every run: events, not
timings. The triggerer must still stop.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from tests.support.airflow import AirflowDeployment
from tests.support.execution_api_gate import gated_environment
from tests.support.processes import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]


def test_a_triggerer_told_to_stop_while_it_warms_its_execution_api_up_stops(tmp_path: Path) -> None:
    """FAULT_MODEL 7 (liveness) and 10 (restarts): a stop during the warm-up is never lost."""
    gate, env = gated_environment(tmp_path)
    dags = tmp_path / "dags"
    dags.mkdir()
    deployment = AirflowDeployment(home=tmp_path / "home", dags_folder=dags, env=env)
    deployment.migrate()
    triggerer = deployment.start_component("triggerer")
    try:
        wait_until(
            lambda: (gate / "entered").exists() or triggerer.poll() is not None,
            300,
            "the supervisor's Execution API loop thread importing during the warm-up",
        )
        assert triggerer.poll() is None, deployment.log_path("triggerer").read_text()[-3000:]
        os.kill(triggerer.pid, signal.SIGTERM)
        (gate / "release").touch()
        wait_until(lambda: triggerer.poll() is not None, 300, "the triggerer to exit after its SIGTERM")
    finally:
        deployment.stop()
