"""
A real ``airflow triggerer`` told to stop while its supervisor warms its Execution API up before
forking its trigger runner (issue 50, :mod:`airflow_shared_stream.execution_api_warmup`).

The warm-up's one request is answered on Airflow's ``InProcessExecutionAPI-loop`` thread while
the supervisor's main thread waits for it. A SIGTERM then ends the warm-up on the main thread
(``runner_fork`` keeps it and sends it again after the fork) while the loop thread is still
importing (anyio's modules, at the app's first request): the process forks its runner with that
import half done, a module lock held by a thread the runner does not have. The import is held
at a gate (a module finder on the triggerer's ``PYTHONPATH``) so the signal lands there on every
run: events, not timings. The triggerer must still stop.
"""

from __future__ import annotations

import os
import signal
import textwrap
from pathlib import Path

import pytest

from tests.support.airflow import REPO, AirflowDeployment
from tests.support.processes import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

GATE = textwrap.dedent(
    """
    import os, sys, threading, time
    _gate = os.environ.get("WARMUP_GATE_DIR")
    class _WarmupGate:
        # Holds the API loop thread's first anyio import of the warm-up until the test releases it.
        def find_spec(self, name, path=None, target=None):
            loop_thread = threading.current_thread().name == "InProcessExecutionAPI-loop"
            if not name.startswith("anyio") or not loop_thread:
                return None
            entered = os.path.join(_gate, "entered")
            if os.path.exists(entered):
                return None
            open(entered, "w").close()
            while not os.path.exists(os.path.join(_gate, "release")):
                time.sleep(0.05)
            return None
    if _gate:
        sys.meta_path.insert(0, _WarmupGate())
    """
)


def test_a_triggerer_told_to_stop_while_it_warms_its_execution_api_up_stops(tmp_path: Path) -> None:
    """FAULT_MODEL 7 (liveness) and 10 (restarts): a stop during the warm-up is never lost."""
    gate, site, dags = tmp_path / "gate", tmp_path / "site", tmp_path / "dags"
    for folder in (gate, site, dags):
        folder.mkdir()
    (site / "sitecustomize.py").write_text(GATE)
    deployment = AirflowDeployment(
        home=tmp_path / "home",
        dags_folder=dags,
        env={"WARMUP_GATE_DIR": str(gate), "PYTHONPATH": f"{site}{os.pathsep}{REPO}"},
    )
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
