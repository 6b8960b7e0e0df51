"""
Airflow core's stranded asset events (apache/airflow#56050), with and without the mitigation.

A probe Dag (one watcher, ``max_active_runs=1``, a task that holds the slot a while) gets a
burst of messages and nothing after it. Without ``[shared_stream] requeue_stranded_asset_events``
core 3.3.2 leaves the tail of the burst in no run for good; with it every event is consumed. If
the first case stops stranding (core fixed or changed it), this test fails so the docs and the
mitigation get revisited. No Spark: the probe's task only holds the slot until the test releases
it (once the whole burst is persisted), so each case takes about a minute and a half.

The burst is shaped so that core strands its tail on any machine (:func:`_send_the_burst`). Sent
all at once, whether a tail was stranded depended on where the scheduler created the first run:
in a CI run of 2026-11-25 it did so mid-burst, the last event queued a fresh row after it, and
the second run took every event that was left (nothing stranded, the test timed out).

The last test runs two schedulers on PostgreSQL with the mitigation on, for a Dag on two assets.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from tests.e2e.conftest import MITIGATION_ENV
from tests.support.airflow import AirflowDeployment, airflow_deployment
from tests.support.brokers import KafkaBroker
from tests.support.postgres import PostgresServer
from tests.support.processes import wait_until
from tests.support.stranding_probe import PROBE_DAG

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]

DAG_ID = "stranding_probe"
BURST = 12
HOLD_LIMIT_SECONDS = 180
"""Each run holds the Dag's only slot until the test releases it (the rest of the burst arrives
meanwhile, on a machine of any speed), and never longer than this."""


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
    release = home / "release-the-slot"
    env = {
        MITIGATION_ENV: str(mitigation),
        "STRANDING_PROBE_TOPIC": topic,
        "STRANDING_PROBE_TASK_SECONDS": str(HOLD_LIMIT_SECONDS),
        "STRANDING_PROBE_RELEASE_FILE": str(release),
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
        assert any(r.state == "running" for r in airflow.dag_runs(DAG_ID)), "the first run ended too soon"
        release.touch()  # the burst is in while the first run holds the slot: every run may end now
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


TWO_ASSET_DAGS = """
from __future__ import annotations

import os
import time

from airflow.sdk import DAG, Asset, AssetAny, AssetWatcher, task

from airflow_shared_stream.kafka.trigger import KafkaSharedStreamTrigger


def _asset(side: str) -> Asset:
    topic = os.environ[f"TWO_SCHEDULERS_TOPIC_{side.upper()}"]
    trigger = KafkaSharedStreamTrigger(topics=[topic], kafka_conn_id="kafka_default", group_id=topic)
    return Asset(
        f"two_schedulers_{side}",
        uri=f"kafka://probe/{topic}",
        watchers=[AssetWatcher(name=f"two_schedulers_{side}_watcher", trigger=trigger)],
    )


A, B = _asset("a"), _asset("b")

with DAG(dag_id="two_schedulers", schedule=AssetAny(A, B), max_active_runs=1, catchup=False):

    @task
    def hold_the_slot() -> None:
        time.sleep(float(os.environ.get("STRANDING_PROBE_TASK_SECONDS", "4")))

    hold_the_slot()

# Events of asset b that no trigger created (a task's outlet): the refresh does not see them,
# only the scheduler's sweep brings them to a run when they strand.
with DAG(dag_id="two_schedulers_outlet", schedule=None, catchup=False):

    @task(outlets=[B])
    def update_b() -> None:
        pass

    update_b()
"""


def test_two_schedulers_and_a_dag_on_two_assets_consume_every_event_once(
    kafka: KafkaBroker, e2e_dir: Path, postgres: PostgresServer
) -> None:
    """
    Two real schedulers on PostgreSQL, the mitigation on, a Dag on two assets fed while its only
    slot is busy, by two watchers and by a task outlet (whose stranded events only the sweep
    re-queues): every event ends in exactly one run, and no run is empty.

    A race, not a proof: which scheduler creates or sweeps which run is up to them. The
    interleavings that broke the sweep are played deterministically, with core's own
    run-creation code, in tests/integration/scheduling/test_sweep_with_two_schedulers.py.
    """
    dag_id, topics = "two_schedulers", {"a": "two-schedulers-a", "b": "two-schedulers-b"}
    kafka.create_topics(topics.values())
    home = e2e_dir / "airflow-two-schedulers"
    dags = home / "dags"
    dags.mkdir(parents=True)
    (dags / "two_schedulers.py").write_text(TWO_ASSET_DAGS)
    env = {
        MITIGATION_ENV: "True",
        "TWO_SCHEDULERS_TOPIC_A": topics["a"],
        "TWO_SCHEDULERS_TOPIC_B": topics["b"],
        "STRANDING_PROBE_TASK_SECONDS": "8",
        "AIRFLOW_CONN_KAFKA_DEFAULT": json.dumps(
            {
                "conn_type": "kafka",
                "extra": {"bootstrap.servers": kafka.bootstrap, "auto.offset.reset": "earliest"},
            }
        ),
    }
    database = postgres.create_database("airflow_two_schedulers")
    with airflow_deployment(home, dags, env, parallelism=2, database_url=database) as airflow:
        airflow.start_component("scheduler", name="scheduler-2")
        airflow.wait_for_dags({dag_id, "two_schedulers_outlet"})
        airflow.wait_for_watchers({"two_schedulers_a_watcher", "two_schedulers_b_watcher"})

        def events() -> set[int]:
            return {
                e.id for name in ("two_schedulers_a", "two_schedulers_b") for e in airflow.asset_events(name)
            }

        def settled() -> bool:
            airflow.check_alive()
            runs = airflow.dag_runs(dag_id)
            return (
                bool(runs)
                and all(r.state in {"success", "failed"} for r in runs)
                and not airflow.queued_assets(dag_id)
                and {i for r in runs for i in r.asset_event_ids} >= events()
            )

        expected = 0
        for round_number in range(3):
            kafka.produce(topics["a"], [{"round": round_number, "n": 0}])
            expected += 1
            wait_until(
                lambda: any(r.state == "running" for r in airflow.dag_runs(dag_id)),
                120,
                "a run to hold the slot",
                interval=0.5,
            )
            kafka.produce(topics["b"], [{"round": round_number, "n": 1}])
            for _ in range(2):
                airflow.trigger_dag("two_schedulers_outlet")
            kafka.produce(topics["a"], [{"round": round_number, "n": n} for n in range(2, 5)])
            expected += 1 + 2 + 3
            wait_until(lambda n=expected: len(events()) >= n, 180, f"{expected} asset events", interval=0.5)
            wait_until(settled, 300, "every event consumed and the Dag idle", interval=1.0)

        runs = airflow.dag_runs(dag_id)
        consumed = [i for r in runs for i in r.asset_event_ids]
        with airflow.db() as conn:
            creators = conn.execute(
                "SELECT creating_job_id, count(*) AS runs FROM dag_run WHERE dag_id = ? GROUP BY 1",
                (dag_id,),
            ).fetchall()
        sweeps = {
            name: airflow.log_path(name).read_text(errors="replace").count(f"Re-queued Dag {dag_id} ")
            for name in ("scheduler", "scheduler-2")
        }
        print(
            f"two schedulers: {len(events())} asset events in {len(runs)} runs;"
            f" runs per creating scheduler job: {[(r['creating_job_id'], r['runs']) for r in creators]};"
            f" sweeps that re-queued stranded events, per scheduler: {sweeps}"
        )
        assert all(r.asset_event_ids for r in runs), "a run with no asset event"
        assert len(consumed) == len(set(consumed)) == len(events()), "an event consumed twice"
        assert all(r.state == "success" for r in runs)
