"""
A real ``airflow triggerer``'s trigger runner never walks, in its garbage collections, the
objects its supervisor had when it forked the runner (issue 50, :mod:`airflow_shared_stream.runner_fork`).

The runner's first full collection, set off by a stream's first allocations, walked Airflow's
modules and the SDKs the supervisor imports before the fork, on the event loop: the triggerer
reported its loop blocked 0.2 s on an idle machine (docs/benchmarks.rst, "Loop blocks at
start"). A watcher's trigger reports, from inside the runner, whether the collector tracks those
modules: an event, not a timing.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.airflow import AirflowDeployment
from tests.support.processes import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

DAG = """
from airflow.sdk import DAG, Asset, AssetWatcher
from airflow.providers.standard.operators.empty import EmptyOperator
from tests.support.heap_probe import HeapProbeTrigger

probe = Asset("heap_probe", watchers=[AssetWatcher(name="heap_probe_w", trigger=HeapProbeTrigger())])
with DAG(dag_id="heap_probe", schedule=probe, catchup=False):
    EmptyOperator(task_id="nothing")
"""


def test_the_trigger_runners_collector_never_walks_what_the_supervisor_had_at_the_fork(
    tmp_path: Path,
) -> None:
    """FAULT_MODEL 13 (load): a full collection of the inherited heap held the runner's loop."""
    dags = tmp_path / "dags"
    dags.mkdir()
    (dags / "heap_probe.py").write_text(DAG)
    deployment = AirflowDeployment(home=tmp_path / "home", dags_folder=dags)
    deployment.migrate()
    try:
        deployment.start_component("dag-processor")
        deployment.start_component("triggerer")

        def reported() -> bool:
            deployment.check_alive()
            return bool(deployment.asset_events("heap_probe"))

        wait_until(reported, 300, "the heap probe's event from the trigger runner", interval=0.5)
        payload = deployment.asset_events("heap_probe")[0].payload
        assert "airflow_shared_stream.sqs.producer" in payload["imported"], payload
        assert payload["collected"] == [], (
            f"the trigger runner's collector walks what its supervisor had at the fork: "
            f"{payload['collected']}"
        )
    finally:
        deployment.stop()
