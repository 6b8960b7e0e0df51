"""
A real ``airflow triggerer``'s job keeps beating while its supervisor warms up before it forks its
trigger runner (issue 50 follow-up, :mod:`airflow_shared_stream.warmup_heartbeat`).

The warm-up (the brokers' imports, then the Execution API's build and first request) ran on the
supervisor's main thread before Airflow's supervisor loop, the only sender of the job's
heartbeat, had started: 29-31 s on a busy 2-core machine, "Heartbeat recovered after 34.9 s",
and meanwhile the triggerer looked dead to health checks and to other triggerers
(docs/benchmarks.rst). Here the API's first request, most of the warm-up, is held at a gate
(``tests.support.execution_api_gate``): while it is held, the fork hook has not returned, so the
runner does not exist. With ``job_heartbeat_sec`` at 1 s the job's ``latest_heartbeat`` must
advance, twice, during that hold. Events, not timings: the gate holds as long as the test needs.
"""

from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path

import pytest

from tests.support.airflow import AirflowDeployment
from tests.support.execution_api_gate import gated_environment
from tests.support.processes import tail, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]

GENEROUS = 120.0
"""Seconds any one wait may take (a heartbeat is due every second: at load 20 it comes in a few)."""

WARMED = "Warmed the in-process Execution API up before the trigger runner starts"
"""The warm-up's own line, logged once its request is answered: the fork comes after it."""


def _latest_heartbeat(deployment: AirflowDeployment) -> datetime:
    with deployment.db() as conn:
        row = conn.execute(
            "SELECT max(latest_heartbeat) AS beat FROM job WHERE job_type = 'TriggererJob'"
        ).fetchone()
    beat = row["beat"] if row and row["beat"] else datetime.min
    beat = beat if isinstance(beat, datetime) else datetime.fromisoformat(beat)
    return beat if beat.tzinfo else beat.replace(tzinfo=timezone.utc)


def test_the_triggerer_job_beats_while_its_supervisor_warms_up_before_the_fork(tmp_path: Path) -> None:
    """FAULT_MODEL 7 (liveness): a busy triggerer's warm-up never makes it look dead."""
    gate, env = gated_environment(tmp_path)
    dags = tmp_path / "dags"
    dags.mkdir()
    deployment = AirflowDeployment(
        home=tmp_path / "home",
        dags_folder=dags,
        env={**env, "AIRFLOW__TRIGGERER__JOB_HEARTBEAT_SEC": "1"},
    )
    deployment.migrate()
    triggerer = deployment.start_component("triggerer")
    log = deployment.log_path("triggerer")
    try:
        wait_until(
            lambda: (gate / "entered").exists() or triggerer.poll() is not None,
            300,
            "the warm-up's Execution API request, held at the gate",
        )
        assert triggerer.poll() is None, tail(log, 60)
        beats = [_latest_heartbeat(deployment)]
        for _ in range(2):
            wait_until(
                lambda: triggerer.poll() is not None or _latest_heartbeat(deployment) > beats[-1],
                GENEROUS,
                f"a triggerer heartbeat after {beats[-1]} while the warm-up's request is held",
                0.2,
            )
            assert triggerer.poll() is None, tail(log, 60)
            beats.append(_latest_heartbeat(deployment))
        # Still held: the hook has not returned, the runner is not forked.
        assert WARMED not in log.read_text(errors="replace"), tail(log, 60)

        (gate / "release").touch()
        wait_until(
            lambda: triggerer.poll() is not None or WARMED in log.read_text(errors="replace"),
            GENEROUS,
            "the warm-up to end once its request is released",
        )
        assert triggerer.poll() is None, tail(log, 60)
    finally:
        (gate / "release").touch()
        deployment.stop()
