"""
A deferred Spark task marked failed while its triggerer is dead: its driver is killed all the same.

Airflow 3.3.2 kills a deferred task's driver only through ``on_kill`` in the triggerer that runs
its trigger. Here that triggerer (A) is SIGKILLed; the user marks the task failed; triggerer B's
``Trigger.clean_unused`` deletes the trigger row within a second, long before A's triggers would
be handed over (``triggerer_health_check_threshold``, set far out of reach here so no hand-over
can hide the gap). Nobody runs ``on_kill``. The driver must still die: the next poll of the master
(B, waiting on another Spark task) kills drivers whose task has ended.

Real PostgreSQL, dag-processor, scheduler, api-server and two triggerers; the master is the
recording fake (drivers are data: a SIGKILLed triggerer needs no JVM to show the gap), whose
drivers carry their create request's Spark properties in their launch command as a real worker
writes it.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.integration.spark.conftest import APPS
from tests.support.airflow import AirflowDeployment
from tests.support.fake_spark_master import FakeSparkMaster
from tests.support.postgres import postgres_server
from tests.support.processes import tail, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.e2e, pytest.mark.timeout(900)]

DAG_FILE = Path(__file__).parent / "dag_test_script.py"
DAG_ID, TASK_ID = "deferrable_spark_dag_test", "spark"
CONN_ID = "spark_orphan"
FIRST, SECOND = "triggerer-a", "triggerer-b"


@dataclass
class OrphanStack:
    airflow: AirflowDeployment
    master: FakeSparkMaster

    def task(self, run_id: str) -> dict[str, Any]:
        with self.airflow.db() as conn:
            found = conn.execute(
                "SELECT ti.state, ti.trigger_id, t.triggerer_id FROM task_instance ti "
                "LEFT JOIN trigger t ON t.id = ti.trigger_id "
                "WHERE ti.dag_id = ? AND ti.task_id = ? AND ti.run_id = ?",
                (DAG_ID, TASK_ID, run_id),
            ).fetchone()
        return dict(found) if found else {}

    def trigger_count(self) -> int:
        with self.airflow.db() as conn:
            return int(conn.execute("SELECT count(*) AS n FROM trigger").fetchone()["n"])

    def triggerer_jobs(self) -> list[int]:
        with self.airflow.db() as conn:
            rows = conn.execute("SELECT id FROM job WHERE job_type = 'TriggererJob' ORDER BY id").fetchall()
        return [r["id"] for r in rows]

    def wait(self, condition: Any, timeout: float, what: str, *components: str) -> None:
        try:
            wait_until(condition, timeout, what, interval=0.5)
        except RuntimeError as exc:
            logs = "\n".join(f"--- {c}\n{tail(self.airflow.log_path(c))}" for c in components)
            raise RuntimeError(f"{exc}; tasks: {self.airflow.task_instances(DAG_ID)}\n{logs}") from None

    def deferred_on(self, run_id: str, triggerer_job: int) -> bool:
        task = self.task(run_id)
        return task.get("state") == "deferred" and task.get("triggerer_id") == triggerer_job

    def new_driver(self, before: set[str]) -> str:
        (driver_id,) = set(self.master.drivers) - before
        return driver_id


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[OrphanStack]:
    home = tmp_path_factory.mktemp("airflow-spark-orphan")
    dags = home / "dags"
    dags.mkdir()
    (dags / "spark_orphan.py").symlink_to(DAG_FILE)
    with FakeSparkMaster(token="orphan-test-token") as master, postgres_server() as postgres:
        env = {
            f"AIRFLOW_CONN_{CONN_ID.upper()}": json.dumps(master.connection()),
            "DAG_TEST_SPARK_CONN_ID": CONN_ID,
            "DAG_TEST_SPARK_APP": str(APPS / "sleeper.py"),
            # No hand-over of A's triggers while the test runs: the gap stays open.
            "AIRFLOW__TRIGGERER__TRIGGERER_HEALTH_CHECK_THRESHOLD": "3600",
        }
        airflow = AirflowDeployment(
            home=home,
            dags_folder=dags,
            env=env,
            database_url=postgres.create_database("airflow_spark_orphan"),
        )
        try:
            airflow.migrate()
            for component in ("dag-processor", "scheduler", "api-server"):
                airflow.start_component(component)
            airflow.start_component("triggerer", name=FIRST)
            airflow.wait_for_dags({DAG_ID})
            yield OrphanStack(airflow=airflow, master=master)
        finally:
            airflow.stop()


def test_a_task_marked_failed_while_its_triggerer_is_dead_loses_its_driver(stack: OrphanStack) -> None:
    airflow = stack.airflow
    before = set(stack.master.drivers)
    airflow.cli("dags", "trigger", DAG_ID, "--run-id", "orphan")
    stack.wait(
        lambda: stack.task("orphan").get("triggerer_id") is not None, 300, "A to run the trigger", FIRST
    )
    (first_job,) = stack.triggerer_jobs()
    assert stack.deferred_on("orphan", first_job)
    orphan = stack.new_driver(before)
    assert stack.master.drivers[orphan].state == "RUNNING"

    airflow.start_component("triggerer", name=SECOND)
    stack.wait(lambda: len(stack.triggerer_jobs()) == 2, 120, "triggerer B to start", SECOND)
    second_job = stack.triggerer_jobs()[1]
    airflow.kill_triggerer(FIRST)
    del airflow.procs[FIRST]  # dead for good: no on_kill can come from A

    resp = httpx.patch(
        f"{airflow.api_url}/api/v2/dags/{DAG_ID}/dagRuns/orphan/taskInstances/{TASK_ID}",
        json={"new_state": "failed"},
        timeout=60,
    )
    assert resp.status_code == 200, resp.text
    # B's clean_unused deletes the trigger: nothing is left for anyone to cancel or hand over.
    stack.wait(lambda: stack.trigger_count() == 0, 120, "B to delete the failed task's trigger", SECOND)
    assert stack.task("orphan")["state"] == "failed"
    assert stack.master.drivers[orphan].state == "RUNNING", "killed before anyone polled the master"

    # The next Spark task defers on B; B's poll of the master finds the orphan and kills it.
    before = set(stack.master.drivers)
    airflow.cli("dags", "trigger", DAG_ID, "--run-id", "next")
    stack.wait(lambda: stack.deferred_on("next", second_job), 300, "the next task to defer on B", SECOND)
    stack.wait(
        lambda: stack.master.drivers[orphan].state == "KILLED",
        120,
        "B to kill the driver of the task marked failed",
        SECOND,
    )
    # The deferred task's own driver is left alone, and the task still waits on it.
    assert stack.master.drivers[stack.new_driver(before)].state == "RUNNING"
    assert stack.deferred_on("next", second_job)
    assert stack.master.token is not None
    assert stack.master.token not in airflow.log_path(SECOND).read_text(errors="replace")
