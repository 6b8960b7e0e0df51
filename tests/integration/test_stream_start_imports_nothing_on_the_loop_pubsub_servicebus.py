"""
Pub/Sub's and Service Bus's stream starts in a real ``airflow triggerer`` import nothing on the
trigger runner's event loop (issue 50 attack, :data:`airflow_shared_stream.runner_fork.STREAM_START_MODULES`).

tests/integration/test_stream_start_imports_nothing_on_the_loop.py covers SQS and Kafka only; the
supervisor's preload (the producers, their SDKs and the Task SDK modules of a first connection
read) is meant for every broker. Here the same recorder
(tests/support/loop_imports/sitecustomize.py) watches the runner of a triggerer whose watchers read
a Pub/Sub subscription (the official emulator) and a Service Bus queue (the suite's AMQP server),
read after each stream's first asset event: an event, not a timing.
"""

from __future__ import annotations

import contextlib
import time
import uuid
from pathlib import Path

import pytest

from bench.startup_rigs import RIGS, Rig
from tests.integration.test_stream_start_imports_nothing_on_the_loop import (
    CANARY_AGAIN_AFTER,
    GENEROUS,
    PROBE_DIR,
    REPO,
    _recorded,
)
from tests.support.airflow import AirflowDeployment
from tests.support.processes import tail

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]

BROKERS = ("pubsub", "servicebus")

DAG = """
from airflow.sdk import DAG, Asset, AssetWatcher
from airflow.providers.standard.operators.empty import EmptyOperator

{imports}

n = 0
assets = [
    Asset("pubsub_start", watchers=[AssetWatcher(name="pubsub_start_w", trigger={pubsub})]),
    Asset("servicebus_start", watchers=[AssetWatcher(name="servicebus_start_w", trigger={servicebus})]),
]
with DAG(dag_id="loop_imports_2", schedule=assets[0] | assets[1], catchup=False):
    EmptyOperator(task_id="nothing")
"""


def _without_events(airflow: AirflowDeployment) -> set[str]:
    return {b for b in BROKERS if not airflow.asset_events(f"{b}_start")}


def test_pubsub_and_servicebus_starts_import_nothing_on_the_runners_event_loop(tmp_path: Path) -> None:
    """FAULT_MODEL 13 (load): what a Pub/Sub or Service Bus stream's start imports on the loop."""
    out = tmp_path / "loop-imports"
    out.mkdir()
    with contextlib.ExitStack() as stack:
        rigs: dict[str, Rig] = {broker: RIGS[broker](stack) for broker in BROKERS}
        dags = tmp_path / "dags"
        dags.mkdir()
        (dags / "loop_imports_2.py").write_text(
            DAG.format(
                imports="\n".join(rig.imports for rig in rigs.values()),
                pubsub=rigs["pubsub"].trigger,
                servicebus=rigs["servicebus"].trigger,
            )
        )
        env = {key: value for rig in rigs.values() for key, value in rig.env.items()}
        airflow = AirflowDeployment(
            home=tmp_path / "airflow",
            dags_folder=dags,
            env={**env, "PYTHONPATH": f"{PROBE_DIR}:{REPO}", "LOOP_IMPORTS_OUT": str(out)},
        )
        airflow.migrate()
        stack.callback(airflow.stop)
        airflow.start_component("dag-processor")
        airflow.wait_for_dags({"loop_imports_2"}, timeout=GENEROUS)
        airflow.start_component("triggerer")
        airflow.wait_for_watchers({f"{b}_start_w" for b in BROKERS}, timeout=GENEROUS)

        deadline = time.monotonic() + GENEROUS
        while waiting := _without_events(airflow):
            assert time.monotonic() < deadline, (
                f"no asset event of {sorted(waiting)} in {GENEROUS:.0f} s\n"
                f"{tail(airflow.log_path('triggerer'), 60)}"
            )
            airflow.check_alive()
            for broker in waiting:
                rigs[broker].publish({"canary": f"canary-{uuid.uuid4().hex[:8]}"})
            again = time.monotonic() + CANARY_AGAIN_AFTER
            while time.monotonic() < again and _without_events(airflow) == waiting:
                time.sleep(0.2)
        files, imported = _recorded(out)

    assert files, "the loop-import recorder was never installed in a trigger runner"
    assert imported == [], (
        f"a stream's start imported {len(imported)} module(s) on the trigger runner's event loop: "
        + "; ".join(f"{r['module']} (via {r['via']})" for r in imported)
    )
