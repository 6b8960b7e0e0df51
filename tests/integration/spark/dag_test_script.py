"""Run by test_airflow_dag_test.py in a fresh AIRFLOW_HOME: one Dag, one deferrable Spark task."""

from __future__ import annotations

import json
import sys

from airflow.sdk import DAG

from airflow_shared_stream.spark.operators import DeferrableSparkSubmitOperator

conn_id, application, args_json, expect = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]

with DAG(dag_id="deferrable_spark_dag_test", schedule=None) as dag:
    DeferrableSparkSubmitOperator(
        task_id="spark",
        conn_id=conn_id,
        application=application,
        application_args=json.loads(args_json),
        conf={"spark.ui.enabled": "false", "spark.sql.shuffle.partitions": "2"},
        deferrable=True,
        status_poll_interval=1,
    )

run = dag.test()
state = str(getattr(run.state, "value", run.state))
print(f"DAGRUN_STATE={state}", flush=True)
sys.exit(0 if state == expect else 1)
