"""
A Spark trigger that moves between two real triggerers keeps its driver; a user's clear kills it.

Airflow 3.3 cancels a trigger that moved to another triggerer through the same path as a user's
action on the task: the old triggerer's runner logs "Trigger cancelled by user action, invoking
on_kill" and awaits ``on_kill``. So this runs the real thing: PostgreSQL, dag-processor,
scheduler, api-server and two triggerers, one deferred Spark task on the session's standalone
cluster. Triggerer A is stopped (SIGSTOP) until B takes the trigger over, then resumed: A cancels
its copy and calls ``on_kill``, and the driver must keep running. Marking a deferred task failed
must still kill its driver.

Clearing is not run here: Airflow 3.3.2 cancels a cleared task's trigger only once the scheduler
has picked the task up again, and whether its next try has already reattached to the running
driver by then is a race (docs/spark.rst); test_recording_master.py covers on_kill for each state.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.integration.spark.conftest import APPS
from tests.support.airflow import AirflowDeployment
from tests.support.postgres import postgres_server
from tests.support.processes import tail, wait_until
from tests.support.spark import SparkCluster, pid_alive

pytestmark = [pytest.mark.integration, pytest.mark.e2e, pytest.mark.timeout(900)]

DAG_FILE = Path(__file__).parent / "dag_test_script.py"
DAG_ID, TASK_ID = "deferrable_spark_dag_test", "spark"
CONN_ID = "spark_move"
FIRST, SECOND = "triggerer-a", "triggerer-b"
USER_ACTION_LINE = "Trigger cancelled by user action, invoking on_kill"


@dataclass
class MoveStack:
    airflow: AirflowDeployment
    spark: SparkCluster

    def pid_file(self, run_id: str) -> Path:
        """Where the driver of ``run_id`` writes its Python process's pid (a templated argument)."""
        return self.airflow.home / f"driver-{run_id}.pid"

    def row(self, sql: str, params: tuple[Any, ...] = ()) -> dict[str, Any] | None:
        with self.airflow.db() as conn:
            found = conn.execute(sql, params).fetchone()
        return dict(found) if found else None

    def task(self, run_id: str) -> dict[str, Any] | None:
        """The Spark task instance of ``run_id``: state, trigger, the triggerer running it."""
        return self.row(
            "SELECT ti.state, ti.trigger_id, t.triggerer_id FROM task_instance ti "
            "LEFT JOIN trigger t ON t.id = ti.trigger_id "
            "WHERE ti.dag_id = ? AND ti.task_id = ? AND ti.run_id = ?",
            (DAG_ID, TASK_ID, run_id),
        )

    def triggerer_jobs(self) -> list[int]:
        with self.airflow.db() as conn:
            rows = conn.execute("SELECT id FROM job WHERE job_type = 'TriggererJob' ORDER BY id").fetchall()
        return [r["id"] for r in rows]

    def driver_state(self, driver_id: str) -> str | None:
        state = self.spark.master_state()
        drivers = state.get("activedrivers", []) + state.get("completeddrivers", [])
        return next((d["state"] for d in drivers if d["id"] == driver_id), None)

    def trigger_log(self, triggerer_job: int) -> str:
        """What the triggerer with this job id logged for the task's triggers (the runner's lines too)."""
        files = sorted((self.airflow.home / "logs").rglob(f"*.log.trigger.{triggerer_job}.log"))
        return "\n".join(p.read_text(errors="replace") for p in files)

    def logs(self, name: str) -> str:
        """A component's process log plus every task log (trigger logs go to the task's log)."""
        text = self.airflow.log_path(name).read_text(errors="replace")
        task_logs = sorted((self.airflow.home / "logs").rglob("*.log"))
        return text + "\n".join(p.read_text(errors="replace") for p in task_logs)

    def wait(self, condition: Any, timeout: float, what: str, *components: str) -> None:
        def check() -> bool:
            self.airflow.check_alive()
            return bool(condition())

        try:
            wait_until(check, timeout, what, interval=0.5)
        except RuntimeError as exc:
            logs = "\n".join(f"--- {c}\n{tail(self.airflow.log_path(c))}" for c in components)
            raise RuntimeError(f"{exc}; tasks: {self.airflow.task_instances(DAG_ID)}\n{logs}") from None


def _signal_group(proc: Any, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, sig)


def _kill_active_drivers(spark: SparkCluster) -> None:
    """Leave the session's cluster as found: kill what this module started and left running."""
    headers = {"Authorization": f"Bearer {spark.token}"}
    for driver in spark.master_state().get("activedrivers", []):
        with contextlib.suppress(httpx.HTTPError):
            httpx.post(f"{spark.rest_url}/v1/submissions/kill/{driver['id']}", headers=headers, timeout=10)


@pytest.fixture(scope="module")
def stack(spark_cluster: SparkCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[MoveStack]:
    home = tmp_path_factory.mktemp("airflow-spark-move")
    dags = home / "dags"
    dags.mkdir()
    (dags / "spark_move.py").symlink_to(DAG_FILE)
    ui = {"master-ui-url": f"http://127.0.0.1:{spark_cluster.master_ui_port}"}
    env = {
        f"AIRFLOW_CONN_{CONN_ID.upper()}": spark_cluster.connection_json(**ui),
        "DAG_TEST_SPARK_CONN_ID": CONN_ID,
        "DAG_TEST_SPARK_APP": str(APPS / "sleeper.py"),
        "DAG_TEST_SPARK_ARGS": json.dumps([str(home / "driver-{{ run_id }}.pid"), "900"]),
        # Short, so the move follows the SIGSTOP soon; long enough that a loaded machine's late
        # heartbeats seldom move the trigger on their own (the test holds if they do).
        "AIRFLOW__TRIGGERER__TRIGGERER_HEALTH_CHECK_THRESHOLD": "20",
    }
    with postgres_server() as postgres:
        airflow = AirflowDeployment(
            home=home, dags_folder=dags, env=env, database_url=postgres.create_database("airflow_spark_move")
        )
        try:
            airflow.migrate()
            for component in ("dag-processor", "scheduler", "api-server"):
                airflow.start_component(component)
            airflow.start_component("triggerer", name=FIRST)
            airflow.wait_for_dags({DAG_ID})
            yield MoveStack(airflow=airflow, spark=spark_cluster)
        finally:
            for name in (FIRST, SECOND):
                if name in airflow.procs:
                    _signal_group(airflow.procs[name], signal.SIGCONT)
            airflow.stop()
            _kill_active_drivers(spark_cluster)


def test_a_moved_trigger_keeps_its_driver(stack: MoveStack) -> None:
    airflow = stack.airflow
    run_id = "move"
    airflow.cli("dags", "trigger", DAG_ID, "--run-id", run_id)
    stack.wait(
        lambda: (
            (stack.task(run_id) or {}).get("triggerer_id") is not None and stack.pid_file(run_id).exists()
        ),
        300,
        "the Spark task to defer on triggerer A with its driver running",
        "scheduler",
        FIRST,
    )
    (first_job,) = stack.triggerer_jobs()
    task = stack.task(run_id)
    assert task is not None
    assert task["state"] == "deferred"
    assert task["triggerer_id"] == first_job
    (driver_id,) = set(re.findall(r"as driver (driver-[0-9-]+)", airflow.task_log(DAG_ID, run_id, TASK_ID)))
    assert stack.driver_state(driver_id) == "RUNNING"
    python_pid = int(stack.pid_file(run_id).read_text().split()[0])

    # The move: B starts, A stops heartbeating, B takes the trigger; then A resumes and cancels
    # its copy through the user-action path (Airflow 3.3.2), which awaits on_kill.
    airflow.start_component("triggerer", name=SECOND)
    stack.wait(lambda: len(stack.triggerer_jobs()) == 2, 120, "triggerer B to start", SECOND)
    second_job = stack.triggerer_jobs()[1]
    _signal_group(airflow.procs[FIRST], signal.SIGSTOP)
    try:
        stack.wait(
            lambda: (stack.task(run_id) or {}).get("triggerer_id") == second_job,
            120,
            "triggerer B to take the trigger over",
            SECOND,
        )
    finally:
        _signal_group(airflow.procs[FIRST], signal.SIGCONT)
    stack.wait(
        lambda: USER_ACTION_LINE in stack.trigger_log(first_job),
        120,
        "triggerer A to cancel its copy and call on_kill",
        FIRST,
    )
    # on_kill decided: the driver was killed, or A logged that it keeps running. (Airflow's
    # "trigger completed" does not say so: it repeats the cancel, which ends on_kill's wait
    # while its shielded work goes on.)
    kept = f"Spark driver {driver_id} keeps running"
    stack.wait(
        lambda: (
            stack.driver_state(driver_id) != "RUNNING"
            or kept in stack.trigger_log(first_job) + airflow.log_path(FIRST).read_text(errors="replace")
        ),
        120,
        "triggerer A's on_kill to decide",
        FIRST,
    )
    assert stack.driver_state(driver_id) == "RUNNING", (
        f"a trigger that only moved killed its driver\n{stack.logs(FIRST)[-6000:]}"
    )
    assert pid_alive(python_pid), "the driver's Python process is gone"
    # Still waiting on the same driver (on B; on a loaded machine it may have moved again).
    task = stack.task(run_id)
    assert task is not None
    assert task["state"] == "deferred", task
    assert task["triggerer_id"] is not None, task

    for name in (FIRST, SECOND, "scheduler"):
        assert stack.spark.token not in stack.logs(name), f"the JWS token is in {name}'s logs"


def test_marking_the_deferred_task_failed_kills_its_driver(stack: MoveStack) -> None:
    """A user action still kills: mark the deferred task failed (REST API, as the UI does)."""
    airflow = stack.airflow
    run_id = "mark-failed"
    airflow.cli("dags", "trigger", DAG_ID, "--run-id", run_id)

    def deferred() -> bool:
        task = stack.task(run_id) or {}
        return task.get("state") == "deferred" and task.get("triggerer_id") is not None

    stack.wait(
        lambda: deferred() and stack.pid_file(run_id).exists(),
        300,
        "the new run's task to defer",
        "scheduler",
    )
    (driver_id,) = set(re.findall(r"as driver (driver-[0-9-]+)", airflow.task_log(DAG_ID, run_id, TASK_ID)))
    python_pid = int(stack.pid_file(run_id).read_text().split()[0])
    assert stack.driver_state(driver_id) == "RUNNING"

    resp = httpx.patch(
        f"{airflow.api_url}/api/v2/dags/{DAG_ID}/dagRuns/{run_id}/taskInstances/{TASK_ID}",
        json={"new_state": "failed"},
        timeout=60,
    )
    assert resp.status_code == 200, resp.text
    stack.wait(
        lambda: stack.driver_state(driver_id) == "KILLED",
        120,
        "the triggerer's on_kill to kill the driver of the task marked failed",
        FIRST,
        SECOND,
    )
    wait_until(lambda: not pid_alive(python_pid), 60, "the driver's Python process to exit")
