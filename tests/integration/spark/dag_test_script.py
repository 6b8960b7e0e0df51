"""
A Dag file with one deferrable Spark task, run with ``python <file>`` to ``dag.test()`` it.

test_airflow_dag_test.py copies it into a fresh AIRFLOW_HOME's dags folder (``dag.test()``
creates the run from the parsed, serialized Dag) and passes its settings in environment
variables, so parsing and running see the same Dag. test_trigger_moves.py serves it from a full
deployment (scheduler, two triggerers) the same way.
"""

from __future__ import annotations

import json
import os
import sys

from airflow.sdk import DAG

from airflow_shared_stream.spark.operators import DeferrableSparkSubmitOperator

with DAG(dag_id="deferrable_spark_dag_test", schedule=None) as dag:
    DeferrableSparkSubmitOperator(
        task_id="spark",
        conn_id=os.environ.get("DAG_TEST_SPARK_CONN_ID", "spark_default"),
        application=os.environ.get("DAG_TEST_SPARK_APP", "app.py"),
        application_args=json.loads(os.environ.get("DAG_TEST_SPARK_ARGS", "[]")),
        conf={"spark.ui.enabled": "false", "spark.sql.shuffle.partitions": "2"},
        deferrable=True,
        status_poll_interval=1,
    )

if __name__ == "__main__":
    run = dag.test()
    state = str(getattr(run.state, "value", run.state))
    print(f"DAGRUN_STATE={state}", flush=True)
    sys.exit(0 if state == os.environ.get("DAG_TEST_EXPECT", "success") else 1)
