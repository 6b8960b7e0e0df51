"""
The order-events pipeline shared by the per-broker example Dags (no Dag in this file).

A shop publishes order events to a broker::

    {"event_id": "5b0c...", "type": "order_created", "order_id": "o-1042", "customer_id": "c-17",
     "amount": 129.9, "currency": "EUR", "occurred_at": "2026-11-21T18:04:05Z"}

Three assets share ONE stream of that broker (one consumer in the triggerer), each with its own
``match``; a message can match several of them. Every broker's Dag is scheduled on any of its
three assets and runs the same three tasks:

``collect_events``
    turns the run's ``triggering_asset_events`` into one JSON-lines record per trigger event
    and writes them where Spark reads them; returns the file's path.
``spark_submit``
    the PySpark job through the stock ``SparkSubmitOperator``: the driver runs in the Airflow
    worker and holds its slot for the whole job (the demo and the e2e tests point its
    connection at ``local[1]``; a ``spark://`` client-mode connection works the same way).
``spark_submit_deferrable``
    the same job through ``DeferrableSparkSubmitOperator`` (cluster mode over the master's REST
    API: the task defers, no worker slot is held while Spark runs).

Each Spark task writes its own output directory, so the two can be compared row for row. The
job de-duplicates on ``event_id``: a message matched by two watchers, or redelivered after a
triggerer crash, is one row.

Everything deployment-specific comes from environment variables (see :func:`setting`) with
defaults that suit a laptop, and credentials only from Airflow Connections, so the same Dags
serve the demo, the e2e tests and a real deployment.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator
from airflow.sdk import Asset, AssetWatcher, get_current_context, task

SPARK_JOB = Path(__file__).parent / "spark_jobs" / "order_events_to_parquet.py"

EVENT_TYPES = ("order_created", "order_cancelled")
LARGE_ORDER_AMOUNT = 500
FAST_START_JVM = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"


@dataclass(frozen=True)
class StreamAsset:
    """One asset of the pipeline and the JMESPath ``match`` that selects its messages."""

    name: str
    match: str


def stream_assets(source: str, body: str) -> list[StreamAsset]:
    """
    The three assets of one broker's order stream.

    :param source: broker name, part of each asset's name.
    :param body: where the decoded message body sits in that broker's envelope
        (``body`` for SQS, ``value`` for Kafka).
    """
    return [
        StreamAsset(f"{source}_orders_created", f"{body}.type == 'order_created'"),
        StreamAsset(f"{source}_orders_cancelled", f"{body}.type == 'order_cancelled'"),
        StreamAsset(
            f"{source}_large_orders",
            f"{body}.type == 'order_created' && {body}.amount >= `{LARGE_ORDER_AMOUNT}`",
        ),
    ]


def reject_expression(body: str) -> str:
    """Dead-letter messages that can never become an order record (checked before ``match``)."""
    return f"{body}.order_id == null || {body}.event_id == null"


def setting(name: str, default: str) -> str:
    """
    The environment variable ``name``, or ``default`` when it is not set.

    Not an Airflow Variable: these settings are read by top-level Dag code, which the
    dag-processor runs at every parse of the file, and ``Variable.get`` there costs a round trip
    to the metadata database (through the API server in Airflow 3) per setting per parse.
    Airflow's best practices say to keep such reads out of top-level code; the environment of
    the Airflow components costs nothing to read and is where deployments put such settings.
    """
    return os.environ.get(name, default)


def data_dir() -> Path:
    return Path(setting("SHARED_STREAM_DATA_DIR", "/tmp/airflow-shared-stream-demo"))


def watched_assets(source: str, body: str, make_trigger: Any) -> list[Asset]:
    """Assets whose watchers share one stream; ``make_trigger(match)`` builds each trigger."""
    assets = []
    for spec in stream_assets(source, body):
        trigger = make_trigger(spec.match)
        assets.append(
            Asset(
                name=spec.name,
                uri=f"file://{data_dir() / source / 'assets' / spec.name}",
                watchers=[AssetWatcher(name=f"{spec.name}_watcher", trigger=trigger)],
            )
        )
    return assets


def records_from_events(
    source: str,
    body_key: str,
    position: Any,
    triggering_asset_events: Mapping[Any, Iterable[Any]],
) -> list[dict[str, Any]]:
    """
    One flat record per trigger event of the run (not yet de-duplicated: Spark does that).

    :param position: ``payload -> str``, the message's position on the broker (for lineage).
    """
    records = []
    for asset, events in triggering_asset_events.items():
        asset_name = getattr(asset, "name", str(asset))
        for event in events:
            payload = (event.extra or {}).get("payload") or {}
            body = payload.get(body_key)
            if not isinstance(body, dict):
                continue  # not an order event; the job would drop it as invalid anyway
            records.append(
                {
                    "event_id": body.get("event_id"),
                    "source": source,
                    "asset": asset_name,
                    "event_type": body.get("type"),
                    "order_id": body.get("order_id"),
                    "customer_id": body.get("customer_id"),
                    "amount": body.get("amount"),
                    "currency": body.get("currency"),
                    "occurred_at": body.get("occurred_at"),
                    "broker_position": position(payload),
                    "asset_event_at": event.timestamp.isoformat(),
                }
            )
    return records


RETRIES: dict[str, Any] = {"retries": 2, "retry_delay": timedelta(seconds=10)}
"""Every task retries, as a production Dag's would: on a loaded machine a task can fail before it
starts (an Execution API read timeout). Each is idempotent: the inbox file is written whole under
the run's name, and the Spark job overwrites its own partitions."""


def build_pipeline(source: str, body_key: str, position: Any) -> None:
    """
    Add the pipeline's tasks to the Dag being defined (call inside ``with DAG(...)``).

    :param source: broker name (``sqs``, ``kafka``): names output directories and records.
    :param body_key: envelope key of the decoded message body.
    :param position: ``payload -> str``, the message's broker position, kept for lineage.
    """
    # Imported here so a deployment without the Spark extra still parses the broker triggers'
    # module and reports this one import error precisely.
    from airflow_shared_stream.spark.operators import DeferrableSparkSubmitOperator

    out = data_dir() / source

    @task(**RETRIES)
    def collect_events() -> str:
        context = get_current_context()
        records = records_from_events(source, body_key, position, context["triggering_asset_events"])
        inbox = out / "inbox"
        inbox.mkdir(parents=True, exist_ok=True)
        path = inbox / f"{context['dag_run'].run_id.replace(':', '_').replace('+', '_')}.jsonl"
        tmp = path.with_suffix(".tmp")
        tmp.write_text("".join(json.dumps(r, sort_keys=True) + "\n" for r in records))
        tmp.replace(path)
        print(f"collected {len(records)} records into {path}")
        return str(path)

    python = sys.executable  # the deployment's interpreter: it has pyspark
    spark_args: dict[str, Any] = {
        "application": str(SPARK_JOB),
        "name": f"{source}_order_events_to_parquet",
        "total_executor_cores": 1,
        "executor_cores": 1,
        "executor_memory": "1g",
        "driver_memory": "1g",
        "conf": {
            "spark.pyspark.python": python,
            "spark.ui.enabled": "false",
            "spark.log.level": "WARN",
            "spark.sql.session.timeZone": "UTC",
            "spark.sql.shuffle.partitions": "2",
            # Small jobs: JVM start-up dominates. C1-only JIT and the serial GC start faster.
            "spark.driver.extraJavaOptions": FAST_START_JVM,
            "spark.executor.extraJavaOptions": FAST_START_JVM,
        },
    }
    inbox_file = "{{ ti.xcom_pull(task_ids='collect_events') }}"

    classic = SparkSubmitOperator(
        task_id="spark_submit",
        conn_id=setting("SHARED_STREAM_SPARK_CONN_ID", "spark_default"),
        **RETRIES,
        application_args=["--input", inbox_file, "--output", str(out / "spark_submit")],
        **{
            **spark_args,
            "conf": {
                **spark_args["conf"],
                "spark.pyspark.driver.python": python,
                "spark.driver.host": "127.0.0.1",
                "spark.driver.bindAddress": "127.0.0.1",
            },
        },
    )
    # [START howto_operator_deferrable_spark_submit]
    deferrable = DeferrableSparkSubmitOperator(
        task_id="spark_submit_deferrable",
        conn_id=setting("SHARED_STREAM_SPARK_DEFERRABLE_CONN_ID", "spark_default"),
        application_args=["--input", inbox_file, "--output", str(out / "spark_submit_deferrable")],
        deferrable=True,
        **spark_args,
        **RETRIES,
    )
    # [END howto_operator_deferrable_spark_submit]
    # One after the other: on a small machine the two jobs would only compete for cores.
    collect_events() >> classic >> deferrable
