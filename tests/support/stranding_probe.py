"""
A probe Dag for Airflow's asset-triggered scheduling: one Kafka watcher, ``max_active_runs=1``,
one task that holds the Dag's only slot a few seconds. No Spark, so what is measured is
Airflow's own part: message -> asset event -> Dag run. Used by
``tests/e2e/test_stranded_asset_events.py`` and ``bench/asset_run_latency.py``.

Environment of the deployment: ``STRANDING_PROBE_TOPIC`` (also the consumer group),
``STRANDING_PROBE_TASK_SECONDS`` (default 4) and ``STRANDING_PROBE_RELEASE_FILE`` (optional: the
task then holds the slot until that file exists, at most the task seconds, so a test ends each
hold when what it waits for has happened instead of after a fixed time); connection
``kafka_default``.
"""

from __future__ import annotations

PROBE_DAG = """
from __future__ import annotations

import os
import time

from airflow.sdk import DAG, Asset, AssetWatcher, task

from airflow_shared_stream.kafka.trigger import KafkaSharedStreamTrigger

TOPIC = os.environ["STRANDING_PROBE_TOPIC"]
probe = Asset(
    "stranding_probe",
    uri=f"kafka://probe/{TOPIC}",
    watchers=[
        AssetWatcher(
            name="stranding_probe_watcher",
            trigger=KafkaSharedStreamTrigger(topics=[TOPIC], kafka_conn_id="kafka_default", group_id=TOPIC),
        )
    ],
)

with DAG(dag_id="stranding_probe", schedule=[probe], max_active_runs=1, catchup=False):

    @task
    def hold_the_slot() -> None:
        deadline = time.monotonic() + float(os.environ.get("STRANDING_PROBE_TASK_SECONDS", "4"))
        release = os.environ.get("STRANDING_PROBE_RELEASE_FILE")
        while time.monotonic() < deadline and not (release and os.path.exists(release)):
            time.sleep(0.2)

    hold_the_slot()
"""
