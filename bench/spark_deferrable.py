"""
Benchmark: what a deferred Spark task costs, on a real JWS-protected standalone cluster.

Measures, against a master and worker started here on loopback (tests/support/spark.py):

1. ``submit``: ``DeferrableSparkSubmitOperator.execute`` from call to ``TaskDeferred`` (REST
   create + task-state write): the time a worker slot is held per task.
2. ``finish_to_event``: from the moment a driver's Python process exits to the trigger's
   event, per poll interval: the latency the trigger adds.
3. ``polling``: N triggers polling N running drivers' status at 1 s in one event loop (as one
   triggerer would): status requests per second served and CPU seconds per request.

Run: ``.venv/bin/python bench/spark_deferrable.py [--triggers 200] [--seconds 20]``.
Writes bench/results/spark_deferrable.json. Every request goes to 127.0.0.1; every loop is
bounded in count and time; the cluster is stopped at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from airflow.sdk.exceptions import TaskDeferred  # noqa: E402

from airflow_shared_stream.spark.hook import AsyncSparkRestClient, SparkRestHook  # noqa: E402
from airflow_shared_stream.spark.operators import DeferrableSparkSubmitOperator  # noqa: E402
from airflow_shared_stream.spark.triggers import SparkApplicationTrigger  # noqa: E402
from tests.support.spark import MemoryTaskStateStore, spark_client_env, spark_standalone_cluster  # noqa: E402

APPS = ROOT / "tests" / "integration" / "spark" / "apps"
CONN_ID = "spark_bench"


def _pct(values: list[float]) -> dict[str, float]:
    values = sorted(values)
    return {
        "n": len(values),
        "p50": round(statistics.median(values), 4),
        "p90": round(values[min(len(values) - 1, int(0.9 * len(values)))], 4),
        "max": round(values[-1], 4),
    }


def _submit(app: Path, args: list[str], poll: float = 1.0) -> tuple[SparkApplicationTrigger, float]:
    op = DeferrableSparkSubmitOperator(
        task_id="bench",
        conn_id=CONN_ID,
        application=str(app),
        application_args=args,
        deferrable=True,
        status_poll_interval=poll,
        conf={"spark.ui.enabled": "false", "spark.driver.memory": "512m"},
    )
    started = time.perf_counter()
    try:
        op.execute({"task_state_store": MemoryTaskStateStore()})
    except TaskDeferred as deferred:
        trigger = deferred.trigger
        assert isinstance(trigger, SparkApplicationTrigger)
        return trigger, time.perf_counter() - started
    raise RuntimeError("the operator did not defer")


async def _event(trigger: SparkApplicationTrigger) -> dict[str, Any]:
    async for event in trigger.run():
        return event.payload
    raise RuntimeError("no event")


async def bench_finish_to_event(work: Path, intervals: list[float], runs: int) -> dict[str, Any]:
    """Driver writes its exit time (hello.py writes the marker last); the trigger reports later."""
    out: dict[str, Any] = {}
    for poll in intervals:
        lat = []
        for i in range(runs):
            marker = work / f"hello-{poll}-{i}.txt"
            trigger, _ = _submit(APPS / "hello.py", [str(marker)], poll)
            event = await asyncio.wait_for(_event(trigger), 180)
            received = time.time()
            assert event["status"] == "success", event
            lat.append(received - marker.stat().st_mtime)
        out[f"poll_{poll}s"] = _pct(lat)
    return out


async def bench_polling(triggers: int, seconds: float, work: Path) -> dict[str, Any]:
    """N concurrent status pollers at 1 s on running drivers: throughput and CPU per request."""
    # Two long-running drivers fill the worker's 2 cores; every poller asks about one of them.
    sleep_for = str(seconds + 60)
    drivers = [_submit(APPS / "sleeper.py", [str(work / f"s{i}.pid"), sleep_for])[0] for i in range(2)]
    cfg = await SparkRestHook(CONN_ID).aget_config()
    counts = [0] * triggers
    errors = [0]
    stop_at = time.monotonic() + seconds

    async def poller(i: int) -> None:
        sid = drivers[i % len(drivers)].submission_id
        async with AsyncSparkRestClient(cfg) as client:
            while time.monotonic() < stop_at:
                try:
                    await client.status(sid)
                    counts[i] += 1
                except Exception:
                    errors[0] += 1
                await asyncio.sleep(1.0)

    cpu0 = resource.getrusage(resource.RUSAGE_SELF)
    t0 = time.perf_counter()
    await asyncio.gather(*(poller(i) for i in range(triggers)))
    elapsed = time.perf_counter() - t0
    cpu1 = resource.getrusage(resource.RUSAGE_SELF)
    cpu = (cpu1.ru_utime - cpu0.ru_utime) + (cpu1.ru_stime - cpu0.ru_stime)
    async with AsyncSparkRestClient(cfg) as client:
        for d in drivers:
            await client.kill(d.submission_id)
    total = sum(counts)
    return {
        "triggers": triggers,
        "seconds": round(elapsed, 2),
        "requests": total,
        "requests_per_s": round(total / elapsed, 1),
        "expected_per_s": triggers,
        "errors": errors[0],
        "client_cpu_ms_per_request": round(1000 * cpu / max(total, 1), 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    parser.add_argument("--triggers", type=int, default=200)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "spark_deferrable.json"))
    args = parser.parse_args()
    os.environ.update(spark_client_env())
    with tempfile.TemporaryDirectory(prefix="spark-bench-") as tmp:
        work = Path(tmp)
        with spark_standalone_cluster(work / "cluster") as cluster:
            os.environ[f"AIRFLOW_CONN_{CONN_ID.upper()}"] = cluster.connection_json(
                **{"master-ui-url": f"http://127.0.0.1:{cluster.master_ui_port}"}
            )
            submit = []
            for i in range(args.runs * 2):
                trigger, seconds = _submit(APPS / "hello.py", [str(work / f"warm{i}.txt")])
                submit.append(seconds)
                asyncio.run(asyncio.wait_for(_event(trigger), 180))
            results = {
                "machine": {"cores": os.cpu_count(), "load_avg_1m_at_start": round(os.getloadavg()[0], 2)},
                "submit_seconds": _pct(submit),
                "finish_to_event_seconds": asyncio.run(bench_finish_to_event(work, [0.5, 2.0], args.runs)),
                "polling": asyncio.run(bench_polling(args.triggers, args.seconds, work)),
            }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(results, indent=2) + "\n")
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
