"""
The deferrable operator through Airflow's own task runner (``dag.test()``), not direct calls.

``dag.test()`` executes the task with the real task runner, serializes the trigger's kwargs
with Airflow's serde, runs the trigger in-process the way the triggerer would and resumes the
task with ``execute_complete``; ``task_state_store`` is Airflow's. It runs in a subprocess so
the Airflow home (SQLite metadata database) is a fresh temporary one.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.integration.spark.conftest import APPS
from tests.support.airflow import migrated_airflow_home

pytestmark = pytest.mark.integration
SCRIPT = Path(__file__).with_name("dag_test_script.py")


@pytest.fixture(scope="module")
def airflow_env(tmp_path_factory: pytest.TempPathFactory, spark_conn_id: str) -> dict[str, str]:
    return migrated_airflow_home(tmp_path_factory.mktemp("airflow-home"), SCRIPT)


def _dag_test(env: dict[str, str], conn_id: str, app: Path, args: list[str], expect: str) -> str:
    dag_file = Path(env["AIRFLOW__CORE__DAGS_FOLDER"]) / SCRIPT.name
    proc = subprocess.run(
        [sys.executable, str(dag_file)],
        env={
            **env,
            "DAG_TEST_SPARK_CONN_ID": conn_id,
            "DAG_TEST_SPARK_APP": str(app),
            "DAG_TEST_SPARK_ARGS": json.dumps(args),
            "DAG_TEST_EXPECT": expect,
        },
        capture_output=True,
        text=True,
        timeout=400,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-6000:]
    return out


def test_dag_test_defers_and_succeeds(airflow_env, spark_conn_id, spark_cluster, tmp_path):
    # A driver without a SparkSession keeps this fast; the Parquet job is covered by
    # test_deferrable_operator.py, the Airflow plumbing (serde, task state, resume) here.
    marker = tmp_path / "hello.txt"
    out = _dag_test(airflow_env, spark_conn_id, APPS / "hello.py", [str(marker)], "success")
    assert "DAGRUN_STATE=success" in out
    assert "running trigger in line" in out  # it really deferred
    assert "Spark driver driver-" in out
    assert spark_cluster.token not in out
    assert marker.read_text() == "hello from the driver\n"


def test_dag_test_fails_with_the_drivers_message(airflow_env, spark_conn_id, spark_cluster):
    out = _dag_test(airflow_env, spark_conn_id, APPS / "fails.py", ["99"], "failed")
    assert "DAGRUN_STATE=failed" in out
    assert "input batch 99 is corrupt" in out
    assert spark_cluster.token not in out
