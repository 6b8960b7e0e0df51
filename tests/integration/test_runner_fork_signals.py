"""
A real ``airflow triggerer`` told to stop while its supervisor imports the streams' SDKs before
forking its trigger runner (issue 50, :mod:`airflow_shared_stream.runner_fork`).

The imports run inside an ``os.register_at_fork`` hook, and CPython reports an exception that
leaves such a hook as "unraisable" and goes on with the fork. Airflow's SIGTERM/SIGINT handler
raises ``SystemExit`` when no runner exists yet: raised inside the hook, it is lost, and the
triggerer goes on to run as though it had never been told to stop (a rolling restart waits for
its SIGKILL; a supervisor like ``stop_all`` escalates). On a loaded 2-core machine the imports
took 13-15 s (load 11.8), a wide window. The import is held here at a gate (a module finder on the
triggerer's ``PYTHONPATH``) as a slow import holds it, so the signal lands inside the window on
every run: events, not timings.
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
    import os, sys, time
    _gate = os.environ.get("PRELOAD_GATE_DIR")
    class _PreloadGate:
        # Holds the supervisor's pre-fork import of aiokafka until the test releases it.
        def find_spec(self, name, path=None, target=None):
            if name != "aiokafka":
                return None
            frame = sys._getframe()
            while frame is not None and frame.f_code.co_name != "preload_stream_modules":
                frame = frame.f_back
            if frame is None:
                return None
            open(os.path.join(_gate, "entered"), "w").close()
            while not os.path.exists(os.path.join(_gate, "release")):
                time.sleep(0.05)
            return None
    if _gate:
        sys.meta_path.insert(0, _PreloadGate())
    """
)


def _heartbeats(deployment: AirflowDeployment) -> list[str]:
    with deployment.db() as db:
        rows = db.execute("SELECT latest_heartbeat FROM job WHERE job_type = 'TriggererJob'").fetchall()
    return [str(row[0]) for row in rows]


def test_a_triggerer_told_to_stop_while_it_imports_before_the_fork_stops(tmp_path: Path) -> None:
    """FAULT_MODEL 10 (restarts) and 7 (liveness): a stop request is never lost."""
    gate, site, dags = tmp_path / "gate", tmp_path / "site", tmp_path / "dags"
    for folder in (gate, site, dags):
        folder.mkdir()
    (site / "sitecustomize.py").write_text(GATE)
    deployment = AirflowDeployment(
        home=tmp_path / "home",
        dags_folder=dags,
        env={"PRELOAD_GATE_DIR": str(gate), "PYTHONPATH": f"{site}{os.pathsep}{REPO}"},
    )
    deployment.migrate()
    triggerer = deployment.start_component("triggerer")
    try:
        wait_until(
            lambda: (gate / "entered").exists() or triggerer.poll() is not None,
            300,
            "the triggerer's supervisor importing the streams' SDKs before its fork",
        )
        assert triggerer.poll() is None, deployment.log_path("triggerer").read_text()[-3000:]
        heartbeat_before = _heartbeats(deployment)
        os.kill(triggerer.pid, signal.SIGTERM)  # the supervisor: `airflow triggerer` itself
        # Airflow's handler has run once the import is interrupted: the gate's sleep is where it lands.
        (gate / "release").touch()
        wait_until(
            lambda: triggerer.poll() is not None or _heartbeats(deployment) != heartbeat_before,
            300,
            "the triggerer to exit, or to heartbeat as a running triggerer",
        )
        log = deployment.log_path("triggerer").read_text()[-4000:]
        assert triggerer.poll() is not None, f"the triggerer ran on after its SIGTERM:\n{log}"
    finally:
        deployment.stop()
