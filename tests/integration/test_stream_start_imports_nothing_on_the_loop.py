"""
A stream's start in a real ``airflow triggerer`` imports nothing on the trigger runner's event
loop (issue 50, :mod:`airflow_shared_stream.runner_fork`).

``bench/startup.py --sample-loop`` caught the SQS stream's start blocking the runner's loop
0.21-0.28 s on a machine with 8 busy processes: the hook's first connection read
(``BaseHook.aget_connection``) imported the Task SDK's ``Connection`` and the modules behind it on
the loop's thread. The supervisor imported the producers and their SDKs before it forked the
runner, not what a stream imports lazily through Airflow at its start. A Dag's assets are watched
by two of our triggers (SQS and Kafka; Pub/Sub on the official emulator and Service Bus on the
suite's AMQP server); in the runner, a meta path finder
(tests/support/loop_imports/sitecustomize.py) writes down every module imported on the loop's
thread while a frame of ``airflow_shared_stream`` is on the stack. Read after each stream's first
asset event: an event, not a timing.
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

import pytest

from bench.startup_rigs import RIGS, Rig
from tests.support.airflow import AirflowDeployment
from tests.support.canaries import canary_until_each_stream_fires

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]

REPO = Path(__file__).resolve().parents[2]
PROBE_DIR = REPO / "tests" / "support" / "loop_imports"
PAIRS = (("sqs", "kafka"), ("pubsub", "servicebus"))
"""Two streams per deployment: every broker's start is read, in two triggerers."""
GENEROUS = 420.0
"""Seconds any one wait may take: a loaded 2-core machine."""

DAG = """
from airflow.sdk import DAG, Asset, AssetWatcher
from airflow.providers.standard.operators.empty import EmptyOperator

{imports}

n = 0
assets = [
    Asset("{first}_start", watchers=[AssetWatcher(name="{first}_start_w", trigger={first_trigger})]),
    Asset("{second}_start", watchers=[AssetWatcher(name="{second}_start_w", trigger={second_trigger})]),
]
with DAG(dag_id="loop_imports", schedule=assets[0] | assets[1], catchup=False):
    EmptyOperator(task_id="nothing")
"""


def _without_events(airflow: AirflowDeployment, brokers: tuple[str, ...]) -> set[str]:
    return {b for b in brokers if not airflow.asset_events(f"{b}_start")}


def _recorded(out: Path) -> tuple[list[Path], list[dict[str, str]]]:
    files = sorted(out.glob("*.jsonl"))
    return files, [json.loads(line) for f in files for line in f.read_text().splitlines() if line]


@pytest.mark.parametrize("brokers", PAIRS, ids="-".join)
def test_a_streams_start_imports_nothing_on_the_trigger_runners_event_loop(
    tmp_path: Path, brokers: tuple[str, str]
) -> None:
    """FAULT_MODEL 13 (load): a stream's first connection read imported Airflow's modules on the loop."""
    out = tmp_path / "loop-imports"
    out.mkdir()
    with contextlib.ExitStack() as stack:
        rigs: dict[str, Rig] = {broker: RIGS[broker](stack) for broker in brokers}
        first, second = brokers
        dags = tmp_path / "dags"
        dags.mkdir()
        (dags / "loop_imports.py").write_text(
            DAG.format(
                imports="\n".join(rig.imports for rig in rigs.values()),
                first=first,
                second=second,
                first_trigger=rigs[first].trigger,
                second_trigger=rigs[second].trigger,
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
        airflow.wait_for_dags({"loop_imports"}, timeout=GENEROUS)
        airflow.start_component("triggerer")
        airflow.wait_for_watchers({f"{b}_start_w" for b in brokers}, timeout=GENEROUS)

        canary_until_each_stream_fires(airflow, rigs, lambda: _without_events(airflow, brokers), GENEROUS)
        files, imported = _recorded(out)

    assert files, "the loop-import recorder was never installed in a trigger runner"
    assert imported == [], (
        f"a stream's start imported {len(imported)} module(s) on the trigger runner's event loop: "
        + "; ".join(f"{r['module']} (via {r['via']})" for r in imported)
    )
