"""
Message -> asset event -> Dag run: Airflow's own latency, without Spark, on SQLite and PostgreSQL.

The issue's targets (issue 11): message to asset event p95 <= 2 s; from the moment the Dag could
start a run, the run that consumes a message is created within 5 s at p99, for bursts of 1, 50
and 1,000 messages and for a single message after an idle minute.

Rig: noida-db (Kafka protocol), Airflow 3.3.2 (LocalExecutor, parallelism 2) serving the probe
Dag of ``tests/support/stranding_probe.py`` (one watcher, ``max_active_runs=1``, a task that
holds the slot ``--task-seconds``), ``[shared_stream] requeue_stranded_asset_events`` on (or
off with ``--core-scheduling``). Per database: one deployment, then the scenarios in order:
a single message after ``--idle`` seconds with nothing running, then each burst, each published
at once after the previous scenario settled. Per message: publish time (``time.time()`` just
before the produce call), asset event timestamp, the moment the Dag could start a run for it
(``tests/support/pipeline.could_start_at``), and the consuming run's creation. A scenario that
does not consume all its messages within ``--timeout`` is reported as such (with the count).

Results go to bench/results/asset_run_latency.md (``--out``).

Run: .venv/bin/python bench/asset_run_latency.py [--database sqlite postgres] [--bursts 1 50 1000]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import tempfile
import time
import uuid
from datetime import datetime
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.machine import describe  # noqa: E402
from tests.support.airflow import AirflowDeployment, airflow_deployment  # noqa: E402
from tests.support.brokers import KafkaBroker, kafka_broker_process  # noqa: E402
from tests.support.pipeline import Latency, could_start_at  # noqa: E402
from tests.support.postgres import postgres_server  # noqa: E402
from tests.support.processes import wait_until  # noqa: E402
from tests.support.stranding_probe import PROBE_DAG  # noqa: E402

DAG_ID = "stranding_probe"
ASSET = "stranding_probe"
MITIGATION_ENV = "AIRFLOW__SHARED_STREAM__REQUEUE_STRANDED_ASSET_EVENTS"


def _parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    parser.add_argument(
        "--database", nargs="+", choices=("sqlite", "postgres"), default=["sqlite", "postgres"]
    )
    parser.add_argument("--bursts", nargs="+", type=int, default=[1, 50, 1000])
    parser.add_argument("--idle", type=float, default=60.0, help="seconds idle before the single message")
    parser.add_argument("--task-seconds", type=float, default=4.0)
    parser.add_argument("--timeout", type=float, default=600.0, help="per scenario")
    parser.add_argument("--core-scheduling", action="store_true", help="mitigation off")
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "asset_run_latency.md")
    return parser.parse_args(argv)


def _epoch(value: datetime) -> float:
    return value.timestamp()


def _scenario(
    airflow: AirflowDeployment, kafka: KafkaBroker, topic: str, count: int, timeout: float
) -> dict[str, Any]:
    tag = uuid.uuid4().hex[:8]
    ids = [f"{tag}-{n}" for n in range(count)]
    published = time.time()
    kafka.produce(topic, [{"event_id": i} for i in ids])
    wanted = set(ids)

    def consumed() -> dict[str, Any]:
        events = {}
        for e in airflow.asset_events(ASSET):
            body = (e.payload or {}).get("value") if isinstance(e.payload, dict) else None
            if isinstance(body, dict) and body.get("event_id") in wanted:
                events.setdefault(body["event_id"], e)
        runs = airflow.dag_runs(DAG_ID)
        run_of = {}
        by_row = {e.id: i for i, e in events.items()}
        for r in runs:
            for row in r.asset_event_ids:
                if row in by_row:
                    run_of.setdefault(by_row[row], r)
        return {"events": events, "runs": runs, "run_of": run_of}

    state: dict[str, Any] = {}

    def done() -> bool:
        airflow.check_alive()
        state.update(consumed())
        return len(state["run_of"]) == count

    finished = True
    try:
        wait_until(done, timeout, f"{count} messages consumed", interval=1.0)
    except RuntimeError:
        finished = False
    # Let the Dag go idle before the next scenario: no run active, nothing queued.
    with contextlib.suppress(RuntimeError):
        wait_until(
            lambda: (
                all(r.state in {"success", "failed"} for r in airflow.dag_runs(DAG_ID))
                and not airflow.queued_assets(DAG_ID)
            ),
            timeout,
            "the Dag to go idle",
            interval=1.0,
        )
    max_active = airflow.max_active_runs(DAG_ID)
    to_event, wait, to_run = [], [], []
    for event_id, event in state["events"].items():
        to_event.append(_epoch(event.timestamp) - published)
        run = state["run_of"].get(event_id)
        if run is None or run.created_at is None:
            continue
        start = could_start_at(event.timestamp, state["runs"], max_active)
        wait.append(_epoch(run.created_at) - _epoch(start))
        to_run.append(_epoch(run.created_at) - published)
    runs_used = len({r.run_id for r in state["run_of"].values()})
    return {
        "messages": count,
        "asset_events": len(state["events"]),
        "consumed": len(state["run_of"]),
        "finished": finished,
        "runs": runs_used,
        "to_event": Latency(tuple(to_event)) if to_event else None,
        "scheduler_wait": Latency(tuple(wait)) if wait else None,
        "to_run": Latency(tuple(to_run)) if to_run else None,
    }


def _row(database: str, name: str, r: dict[str, Any]) -> str:
    def cell(lat: Latency | None, p: str) -> str:
        return "-" if lat is None else f"{getattr(lat, p):.1f}"

    e, w, t = r["to_event"], r["scheduler_wait"], r["to_run"]
    return (
        f"| {database} | {name} | {r['consumed']}/{r['messages']}{'' if r['finished'] else ' (timed out)'} "
        f"| {r['runs']} | {cell(e, 'p50')} / {cell(e, 'p95')} / {cell(e, 'max')} "
        f"| {cell(w, 'p50')} / {cell(w, 'p99')} / {cell(w, 'max')} "
        f"| {cell(t, 'p50')} / {cell(t, 'p95')} / {cell(t, 'max')} |"
    )


def run_database(args: argparse.Namespace, database: str, work: Path, kafka: KafkaBroker) -> list[str]:
    topic = f"probe-{database}-{uuid.uuid4().hex[:6]}"
    kafka.create_topics([topic])
    home = work / f"airflow-{database}"
    dags = home / "dags"
    dags.mkdir(parents=True)
    (dags / "stranding_probe.py").write_text(PROBE_DAG)
    env = {
        MITIGATION_ENV: str(not args.core_scheduling),
        "STRANDING_PROBE_TOPIC": topic,
        "STRANDING_PROBE_TASK_SECONDS": str(args.task_seconds),
        "AIRFLOW_CONN_KAFKA_DEFAULT": json.dumps(
            {
                "conn_type": "kafka",
                "extra": {"bootstrap.servers": kafka.bootstrap, "auto.offset.reset": "earliest"},
            }
        ),
    }
    rows = []
    with contextlib.ExitStack() as stack:
        url = stack.enter_context(postgres_server()).url() if database == "postgres" else None
        airflow = stack.enter_context(airflow_deployment(home, dags, env, parallelism=2, database_url=url))
        airflow.wait_for_dags({DAG_ID})
        airflow.wait_for_watchers({"stranding_probe_watcher"})
        # Warm-up message: the first run of a Dag starts its event window; not measured.
        _scenario(airflow, kafka, topic, 1, args.timeout)
        print(f"[{database}] idle {args.idle:.0f} s, then 1 message", flush=True)
        time.sleep(args.idle)
        rows.append(
            _row(
                database,
                f"1 message after {args.idle:.0f} s idle",
                _scenario(airflow, kafka, topic, 1, args.timeout),
            )
        )
        print(rows[-1], flush=True)
        for burst in args.bursts:
            result = _scenario(airflow, kafka, topic, burst, args.timeout)
            rows.append(_row(database, f"burst of {burst}", result))
            print(rows[-1], flush=True)
    return rows


def main(argv: list[str] | None = None) -> int:
    args = _parse(sys.argv[1:] if argv is None else argv)
    work = Path(tempfile.mkdtemp(prefix="asset-run-latency-"))
    rows: list[str] = []
    with kafka_broker_process(work / "kafka") as kafka:
        for database in args.database:
            rows += run_database(args, database, work, kafka)
    header = [
        "# Message -> asset event -> Dag run (Airflow's own part, no Spark)",
        "",
        f"Recorded by `.venv/bin/python bench/asset_run_latency.py {' '.join(sys.argv[1:])}`. Probe Dag:",
        "one Kafka watcher (noida-db), `max_active_runs=1`, a task holding the slot "
        f"{args.task_seconds:g} s;",
        f"`[shared_stream] requeue_stranded_asset_events` {'off' if args.core_scheduling else 'on'}.",
        "Each burst is published at once. Seconds; `scheduler wait` = run created - the moment the Dag",
        "could start a run for the message (asset event persisted and the Dag below `max_active_runs`).",
        "",
        describe(["apache-airflow", "aiokafka", "psycopg2-binary"]),
        "",
        "| database | scenario | consumed | runs | message -> asset event p50 / p95 / max "
        "| scheduler wait p50 / p99 / max | message -> run created p50 / p95 / max |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("\n".join(header + rows) + "\n")
    print(args.out.read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
