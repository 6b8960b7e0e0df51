"""
The production recipe of docs/failure-modes.rst: retries, a failure callback, idempotent Spark.

A message is settled on the broker once its asset event is stored, so a failed run never brings
it back from the queue: the run keeps its asset events, retries and clearing use them again, and
the failure callback tells a person which run to clear.
"""

from __future__ import annotations

import logging
from datetime import timedelta
from typing import Any

from airflow.sdk import DAG, Asset, AssetWatcher, task

from airflow_shared_stream.spark.operators import DeferrableSparkSubmitOperator
from airflow_shared_stream.sqs import SqsSharedStreamTrigger

QUEUE_URL = "https://sqs.eu-west-1.amazonaws.com/123456789012/orders"

log = logging.getLogger(__name__)

orders = Asset(
    "s3://lake/orders",
    watchers=[
        AssetWatcher(
            name="orders_watcher",
            trigger=SqsSharedStreamTrigger(
                QUEUE_URL, aws_conn_id="aws_default", reject="body.order_id == null"
            ),
        )
    ],
)


def tell_on_call(context: Any) -> None:
    """The message is in this run's asset events, no longer in the queue: name the run to clear."""
    run = context["dag_run"]
    log.error("Run %s of %s failed; clear it once the cause is fixed", run.run_id, run.dag_id)


with DAG(
    "orders_production",
    schedule=[orders],
    max_active_runs=1,
    default_args={"retries": 3, "retry_delay": timedelta(minutes=1), "retry_exponential_backoff": True},
    on_failure_callback=tell_on_call,
):

    @task
    def order_ids(*, triggering_asset_events: Any = None) -> list[str]:
        """The payload lives in the asset event: the message body, attributes and coordinates."""
        return [str(event.extra["payload"]["body"]["order_id"]) for event in triggering_asset_events[orders]]

    load = DeferrableSparkSubmitOperator(
        task_id="load_orders",
        conn_id="spark_default",
        application="/jobs/load_orders.py",
        # The job merges rows by order id, so a retry or a redelivered message changes nothing.
        application_args=["--orders", "{{ ti.xcom_pull(task_ids='order_ids') | join(',') }}"],
    )
    order_ids() >> load
