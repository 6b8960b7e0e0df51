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

from tests.support.runner_probe import probe_report

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
    payload = probe_report(tmp_path, DAG, "heap_probe")
    assert "airflow_shared_stream.sqs.producer" in payload["imported"], payload
    assert payload["collected"] == [], (
        f"the trigger runner's collector walks what its supervisor had at the fork: {payload['collected']}"
    )
