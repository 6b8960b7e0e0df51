"""
Airflow core's stranded asset events (apache/airflow#56050), with and without the mitigation.

A probe Dag (one watcher, ``max_active_runs=1``, a task that holds the slot a while) gets a
burst of messages and nothing after it. Without ``[shared_stream] requeue_stranded_asset_events``
core 3.3.2 leaves the tail of the burst in no run for good; with it every event is consumed. If
the first case stops stranding (core fixed or changed it), this test fails so the docs and the
mitigation get revisited. No Spark: the probe's task only sleeps, so each case takes ~2 minutes.

The burst is shaped so that core strands its tail on any machine (:func:`_send_the_burst`). Sent
all at once, whether a tail was stranded depended on where the scheduler created the first run:
in a CI run of 2026-11-25 it did so mid-burst, the last event queued a fresh row after it, and
the second run took every event that was left (nothing stranded, the test timed out).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from tests.e2e.conftest import MITIGATION_ENV
from tests.support.airflow import AirflowDeployment, airflow_deployment
from tests.support.brokers import KafkaBroker
from tests.support.processes import wait_until
from tests.support.stranding_probe import PROBE_DAG

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]

DAG_ID = "stranding_probe"
BURST = 12
TASK_SECONDS = 15
"""How long each run holds the Dag's only slot: the rest of the burst arrives meanwhile."""


def _unconsumed(airflow: AirflowDeployment) -> tuple[int, int]:
    """(asset events of the probe, how many of them no run consumed)."""
    events = {e.id for e in airflow.asset_events("stranding_probe")}
    consumed = {i for r in airflow.dag_runs(DAG_ID) for i in r.asset_event_ids}
    return len(events), len(events - consumed)


def _send_the_burst(kafka: KafkaBroker, topic: str, airflow: AirflowDeployment) -> None:
    """
    One message, and once its run holds the slot, the rest of the burst in two parts.

    While the run is busy, the second message queues a row for the Dag; the rest, seconds later,
    find that row and leave it as it is (core 3.3.2). The next run takes the events up to the
    row's time: the second message's. The last ten are in no run, and nothing queues the Dag
    again. With the mitigation each event refreshes the row, and the next run takes them all.
    """
    kafka.produce(topic, [{"n": 0}])
    wait_until(
        lambda: any(r.state == "running" for r in airflow.dag_runs(DAG_ID)),
        120,
        "the first run to hold the slot",
        interval=0.5,
    )
    kafka.produce(topic, [{"n": 1}])
    wait_until(lambda: _unconsumed(airflow)[0] >= 2, 60, "the second message's asset event", interval=0.2)
    time.sleep(2)  # later than the row the second event queued, by more than a clock's step
    assert any(r.state == "running" for r in airflow.dag_runs(DAG_ID)), "the first run ended too soon"
    kafka.produce(topic, [{"n": n} for n in range(2, BURST)])


def _settled(airflow: AirflowDeployment) -> bool:
    """Every run finished and nothing queued: Airflow will not create another run by itself."""
    runs = airflow.dag_runs(DAG_ID)
    return (
        bool(runs)
        and all(r.state in {"success", "failed"} for r in runs)
        and not airflow.queued_assets(DAG_ID)
    )


@pytest.mark.parametrize("mitigation", [False, True], ids=["core-3.3.2", "mitigation-on"])
def test_the_tail_of_a_burst(mitigation: bool, kafka: KafkaBroker, e2e_dir: Path) -> None:
    topic = f"stranding-probe-{str(mitigation).lower()}"
    kafka.create_topics([topic])
    home = e2e_dir / f"airflow-stranding-{str(mitigation).lower()}"
    dags = home / "dags"
    dags.mkdir(parents=True)
    (dags / "stranding_probe.py").write_text(PROBE_DAG)
    env = {
        MITIGATION_ENV: str(mitigation),
        "STRANDING_PROBE_TOPIC": topic,
        "STRANDING_PROBE_TASK_SECONDS": str(TASK_SECONDS),
        "AIRFLOW_CONN_KAFKA_DEFAULT": json.dumps(
            {
                "conn_type": "kafka",
                "extra": {"bootstrap.servers": kafka.bootstrap, "auto.offset.reset": "earliest"},
            }
        ),
    }
    with airflow_deployment(home, dags, env, parallelism=2) as airflow:
        airflow.wait_for_dags({DAG_ID})
        airflow.wait_for_watchers({"stranding_probe_watcher"})
        _send_the_burst(kafka, topic, airflow)
        wait_until(lambda: _unconsumed(airflow)[0] >= BURST, 120, "the burst's asset events", interval=0.5)
        if mitigation:
            wait_until(
                lambda: _unconsumed(airflow)[1] == 0 and _settled(airflow), 240, "every event consumed"
            )
            runs = airflow.dag_runs(DAG_ID)
            assert all(r.state == "success" for r in runs)
            ids = [i for r in runs for i in r.asset_event_ids]
            assert len(ids) == len(set(ids)) == BURST, "an event consumed twice, or one missing"
            return
        # Without it: the Dag goes idle with events that no run consumed, and stays so.
        stable_since: list[float] = []

        def idle_with_stranded_events() -> bool:
            if not (_settled(airflow) and _unconsumed(airflow)[1] > 0):
                stable_since.clear()
                return False
            stable_since[:] = stable_since or [time.monotonic()]
            return time.monotonic() - stable_since[0] > 20

        wait_until(idle_with_stranded_events, 240, "the Dag to go idle with stranded events", interval=1.0)
        total, stranded = _unconsumed(airflow)
        runs = len(airflow.dag_runs(DAG_ID))
        print(f"core 3.3.2: {stranded} of {total} asset events stranded after {runs} runs")
        assert 0 < stranded < total
