"""
Our streams in a real triggerer with 8 busy processes beside it (issue 50, item 5).

``scripts/demo.sh --busy 8`` showed it by hand; this is the test. The rig of ``bench/startup.py``
(SQLite; dag-processor and triggerer only: no scheduler, api-server or Spark, which the guarantee
does not need; its brokers and triggers, ``bench/startup_rigs.py``): one Dag whose six assets
watch two streams, three watchers of ONE Kafka topic (noida-db, the demo's broker) and three of
ONE SQS queue (moto: the leases), all in one triggerer (one deployment's start for both), and
8 processes spinning a core each from before the triggerer starts until the last check:

* each stream consumes a canary (an asset event for every watcher), then every one of the
  messages published after it becomes an asset event for every watcher of its stream
  (at-least-once: none missing, duplicates allowed);
* the triggerer's supervisor never calls its runner "deadlocked" (``machine_load.DEADLOCKED``),
  read once the supervisor has served both streams' first figures writes (the asset state store
  write that stalled it 44-49 s when it built its Execution API then, 30 s when it waited for a
  warm-up thread) and has run its health check since (its job's heartbeat is newer); nor while
  it persisted the burst's asset events (43 s with that warm-up thread beside it);
* no lease lapsed: every SQS asset event of those messages came from the message's first
  receive (leases of 5 s), none the broker refused to extend or the keeper let go, no Kafka
  group session expired (the triggerer's own log).

One Airflow at a time on the machine: it sits with the e2e deployments (``AIRFLOW_AND_SPARK`` in
tests/conftest.py), and its spinners run only for the test's own window.
"""

from __future__ import annotations

import contextlib
import re
import uuid
from datetime import datetime, timezone
from pathlib import Path

import pytest

from bench.startup_rigs import RIGS, Rig, sqs_rig
from tests.support.airflow import AirflowDeployment
from tests.support.canaries import canary_until_each_stream_fires
from tests.support.machine_load import busy_processes, deadlocked_lines, load_average
from tests.support.processes import wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]

REPO = Path(__file__).resolve().parents[2]
BUSY_PROCESSES = 8
WATCHERS = 3
MESSAGES = 20
GENEROUS = 420.0
"""Seconds any one wait may take: a 2-core machine at load 20 with the spinners beside it."""

LEASE_SECONDS = 5
"""The SQS queue's visibility timeout: the lease of issue 50's acceptance check, where a renewal
that came late at load 18 made one duplicate per watcher."""
LEASE_LAPSED = re.compile(r"refused to extend \d+ lease|lease\(s\) held past|Heartbeat session expired")
"""The triggerer's lines for a lease that lapsed: refused by the broker or let go by the keeper
(``common.leases``), or a Kafka group session that expired (aiokafka)."""

SUPERVISOR_STALLS = re.compile(r"Heartbeat recovered after|Warmed the in-process Execution API")
"""Airflow's line for a late heartbeat of the supervisor, and the warm-up's own: the evidence."""

DAG = """
from airflow.sdk import DAG, Asset, AssetWatcher
from airflow.providers.standard.operators.empty import EmptyOperator

{imports}


def _kafka(n):
    return {kafka}


def _sqs(n):
    return {sqs}


assets = [
    Asset(f"{{broker}}_{{n}}", watchers=[AssetWatcher(name=f"{{broker}}_w{{n}}", trigger=trigger(n))])
    for broker, trigger in (("kafka", _kafka), ("sqs", _sqs))
    for n in range({watchers})
]
schedule = assets[0]
for asset in assets[1:]:
    schedule = schedule | asset

with DAG(dag_id="busy_probe", schedule=schedule, catchup=False, max_active_runs=1):
    EmptyOperator(task_id="nothing")
"""
"""Each watcher with a ``match`` of its own (``startup_rigs``): identical triggers would be ONE."""


def _events_by_watcher(airflow: AirflowDeployment, rigs: dict[str, Rig]) -> dict[str, set[str]]:
    """Asset (one per watcher, named ``<broker>_<n>``) -> the ids of its asset events' messages."""
    seen: dict[str, set[str]] = {f"{b}_{n}": set() for b in rigs for n in range(WATCHERS)}
    for event in airflow.asset_events():
        if event.asset_name in seen:
            payload_id = rigs[_broker(event.asset_name)].payload_id(event.payload or {})
            if payload_id is not None:
                seen[event.asset_name].add(payload_id)
    return seen


def _broker(asset_name: str) -> str:
    return asset_name.rsplit("_", 1)[0]


def _streams_without_events(airflow: AirflowDeployment, rigs: dict[str, Rig]) -> set[str]:
    """The brokers with a watcher that has no asset event yet."""
    return {_broker(asset) for asset, ids in _events_by_watcher(airflow, rigs).items() if not ids}


def _received_again(airflow: AirflowDeployment, rig: Rig, messages: set[str]) -> list[str]:
    """SQS asset events of ``messages`` from a second receive: the message's lease had lapsed."""
    again = []
    for event in airflow.asset_events():
        payload = event.payload or {}
        count = (payload.get("attributes") or {}).get("ApproximateReceiveCount")
        if rig.payload_id(payload) in messages and count != "1":
            again.append(f"{event.asset_name}: {rig.payload_id(payload)} received {count} times")
    return again


def _figures_written(airflow: AirflowDeployment) -> set[str]:
    """The brokers whose stream's first figures write reached the asset state store."""
    with airflow.db() as conn:
        rows = conn.execute("SELECT key FROM asset_state_store WHERE key LIKE 'shared_stream.figures.%'")
        return {row["key"].split(".")[2] for row in rows.fetchall()}


def _triggerer_heartbeat(airflow: AirflowDeployment) -> datetime | None:
    with airflow.db() as conn:
        row = conn.execute(
            "SELECT max(latest_heartbeat) AS beat FROM job WHERE job_type = 'TriggererJob'"
        ).fetchone()
    if not row or not row["beat"]:
        return None
    beat = row["beat"] if isinstance(row["beat"], datetime) else datetime.fromisoformat(row["beat"])
    return beat if beat.tzinfo else beat.replace(tzinfo=timezone.utc)


def test_every_message_reaches_every_watcher_with_8_busy_processes_beside_the_triggerer(
    tmp_path: Path,
) -> None:
    with contextlib.ExitStack() as stack:
        rigs = {"kafka": RIGS["kafka"](stack), "sqs": sqs_rig(stack, visibility_timeout=LEASE_SECONDS)}
        dags = tmp_path / "dags"
        dags.mkdir()
        (dags / "busy_probe.py").write_text(
            DAG.format(
                imports="\n".join(rig.imports for rig in rigs.values()),
                kafka=rigs["kafka"].trigger,
                sqs=rigs["sqs"].trigger,
                watchers=WATCHERS,
            )
        )
        env = {key: value for rig in rigs.values() for key, value in rig.env.items()}
        airflow = AirflowDeployment(
            home=tmp_path / "airflow", dags_folder=dags, env={**env, "PYTHONPATH": str(REPO)}
        )
        airflow.migrate()
        stack.callback(airflow.stop)
        airflow.start_component("dag-processor")
        airflow.wait_for_dags({"busy_probe"}, timeout=GENEROUS)
        triggerer_log = airflow.log_path("triggerer")

        with busy_processes(BUSY_PROCESSES) as spinners:
            load_at_start = load_average()
            airflow.start_component("triggerer")
            airflow.wait_for_watchers({f"{b}_w{n}" for b in rigs for n in range(WATCHERS)}, timeout=GENEROUS)

            canary_until_each_stream_fires(
                airflow,
                rigs,
                lambda: _streams_without_events(airflow, rigs),
                GENEROUS,
                lambda: f" (load {load_average()})",
            )

            messages = {b: {f"{b}-{n}-{uuid.uuid4().hex[:8]}" for n in range(MESSAGES)} for b in rigs}
            for broker, ids in messages.items():
                for message in sorted(ids):
                    rigs[broker].publish({"canary": message})

            def missing() -> dict[str, list[str]]:
                airflow.check_alive()
                found = _events_by_watcher(airflow, rigs)
                return {
                    a: sorted(messages[_broker(a)] - ids)
                    for a, ids in found.items()
                    if messages[_broker(a)] - ids
                }

            with contextlib.suppress(RuntimeError):  # what is missing is asserted below
                wait_until(lambda: not missing(), GENEROUS, "every message at every watcher", 0.5)
            # Both first figures writes come 30 s after their stream's first watcher started
            # (common.figures); then the supervisor's health check must run once more.
            wait_until(lambda: _figures_written(airflow) >= set(rigs), GENEROUS, "both streams' figures", 0.5)
            served = datetime.now(timezone.utc)
            wait_until(
                lambda: (_triggerer_heartbeat(airflow) or served) > served,
                GENEROUS,
                "a triggerer heartbeat after the first figures writes",
                0.5,
            )
            not_there = missing()
            deadlocked = deadlocked_lines(triggerer_log)
            log_lines = triggerer_log.read_text(errors="replace").splitlines()
            lapsed = [line for line in log_lines if LEASE_LAPSED.search(line)]
            lapsed += _received_again(airflow, rigs["sqs"], messages["sqs"])
            stalls = [line[:200] for line in log_lines if SUPERVISOR_STALLS.search(line)]
            spinning = [spinner.poll() is None for spinner in spinners]
            load_at_end = load_average()

    context = f"load {load_at_start} at the triggerer's start, {load_at_end} at the end"
    print(context)
    assert spinning == [True] * BUSY_PROCESSES, "a busy process stopped before the last check"
    assert not_there == {}, f"messages with no asset event ({context}): {not_there}"
    assert lapsed == [], f"a lease lapsed ({context}): {lapsed}"
    assert deadlocked == [], f"{context}: {deadlocked}; the supervisor's stalls and warm-up: {stalls}"
