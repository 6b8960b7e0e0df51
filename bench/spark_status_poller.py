"""
Benchmark: many deferred Spark tasks waiting on one master, per-trigger polling vs the shared poller.

For each count of waiting triggers (default 1, 100, 1,000, 5,000) and each mode
(``per-trigger``: every trigger polls its driver's REST status; ``shared``: one poller per
master lists all drivers once per interval), it runs the real ``SparkApplicationTrigger.run()``
coroutines in one event loop, as a triggerer does, and measures:

* **requests/s to the master**, counted by the server, while every trigger waits;
* **triggerer CPU** (this process: user + system, all threads) per second over the same window;
* **finish-to-event** p50/p95: from a driver's end to its trigger's event.

Two masters:

* ``fake`` (every count): ``tests/support/fake_spark_master.py`` in a separate process, a
  recording HTTP server that answers like a standalone master (REST with a JWS check, the web
  UI's JSON state). Drivers are data: the bench tells the server when each one finishes (evenly
  spread over ``--spread`` seconds), so finish times are exact.
* ``real`` (small counts, for correctness): a real JWS-protected standalone master and worker
  (tests/support/spark.py) with two sleeping drivers (the worker has two cores) shared by the
  triggers; requests are counted by recording proxies in front of the REST port and the web
  UI. A driver's end is its Python process's end (start time in its pid file + its sleep).

Run: ``.venv/bin/python bench/spark_status_poller.py`` (about 10 minutes on 2 cores), or
``--counts 20 --steady 1 --spread 1 --no-real --no-plot`` for a smoke run (what
tests/integration/spark/test_bench_smoke.py runs). Writes
``bench/results/spark_status_poller.{json,md,png}``. Everything listens on 127.0.0.1 with free
ports; every server started here is stopped by PID at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.machine import describe  # noqa: E402
from tests.support.processes import free_port, wait_for_port  # noqa: E402

CONN_ID = "spark_poll_bench"
TOKEN = "bench-jws-not-a-real-token"
MODES = ("per-trigger", "shared")


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    values = sorted(values)
    return round(values[min(len(values) - 1, int(q * len(values)))], 3)


def _http_json(url: str, body: dict[str, Any] | None = None) -> Any:
    data = None if body is None else json.dumps(body).encode()
    with urllib.request.urlopen(urllib.request.Request(url, data=data), timeout=30) as resp:
        return json.loads(resp.read())


async def _run_trigger(trigger: Any, events: dict[int, tuple[float, dict[str, Any]]], i: int) -> None:
    async for event in trigger.run():
        events[i] = (time.time(), event.payload)
        return


async def _measure(
    *,
    count: int,
    mode: str,
    submission_ids: list[str],
    requests_seen: Any,
    schedule: Any,
    poll: float,
    steady: float,
    spread: float,
    ramp_timeout: float,
) -> dict[str, Any]:
    """Start ``count`` triggers, measure the steady wait, finish the drivers, time the events."""
    from airflow_shared_stream.spark import poller
    from airflow_shared_stream.spark.triggers import SparkApplicationTrigger

    events: dict[int, tuple[float, dict[str, Any]]] = {}
    triggers = [
        SparkApplicationTrigger(
            submission_id=submission_ids[i % len(submission_ids)],
            conn_id=CONN_ID,
            poll_interval=poll,
            max_transient_errors=1000,
            shared_poller=(mode == "shared"),
        )
        for i in range(count)
    ]
    tasks = [asyncio.ensure_future(_run_trigger(t, events, i)) for i, t in enumerate(triggers)]
    # Ramp: every trigger has read its connection and is waiting (shared: registered with the
    # poller; per-trigger: the master has seen at least `count` status requests).
    ramp_started = time.monotonic()
    base = requests_seen()
    while time.monotonic() - ramp_started < ramp_timeout:
        await asyncio.sleep(0.2)
        if mode == "shared":
            if sum(p.watching for p in poller._POLLERS.values()) >= count:
                break
        elif requests_seen() - base >= count:
            break
    ramp = time.monotonic() - ramp_started
    await asyncio.sleep(poll)  # one full interval in the steady state before measuring
    gc.collect()
    req0, cpu0, t0 = requests_seen(), _cpu(), time.monotonic()
    await asyncio.sleep(steady)
    req1, cpu1, t1 = requests_seen(), _cpu(), time.monotonic()
    finishes = await schedule(spread)
    last_finish = max(finishes.values()) - time.time()
    deadline = time.monotonic() + max(last_finish, 0.0) + max(60.0, 3 * poll)
    await asyncio.wait(tasks, timeout=max(0.0, deadline - time.monotonic()))
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    latencies = [
        at - finishes[payload["submission_id"]]
        for at, payload in events.values()
        if payload["submission_id"] in finishes and payload["status"] == "success"
    ]
    statuses: dict[str, int] = {}
    for _, payload in events.values():
        statuses[payload["status"]] = statuses.get(payload["status"], 0) + 1
    return {
        "triggers": count,
        "mode": mode,
        "ramp_s": round(ramp, 2),
        "requests_per_s": round((req1 - req0) / (t1 - t0), 2),
        "cpu_fraction_of_one_core": round((cpu1 - cpu0) / (t1 - t0), 4),
        "events": len(events),
        "event_statuses": statuses,
        "finish_to_event_p50_s": _pct(latencies, 0.5),
        "finish_to_event_p95_s": _pct(latencies, 0.95),
    }


# -- the fake master ----------------------------------------------------------------------------


def run_fake(count: int, mode: str, args: argparse.Namespace, work: Path) -> dict[str, Any]:
    drivers = {f"driver-20260101000000-{i:05d}": {"state": "RUNNING"} for i in range(count)}
    spec = work / f"drivers-{count}.json"
    spec.write_text(json.dumps(drivers))
    port = free_port()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tests.support.fake_spark_master",
            "--port",
            str(port),
            "--token",
            TOKEN,
            "--drivers",
            str(spec),
        ],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
    )
    try:
        wait_for_port(port, 30, proc, "fake Spark master")
        url = f"http://127.0.0.1:{port}"
        os.environ[f"AIRFLOW_CONN_{CONN_ID.upper()}"] = json.dumps(
            {
                "conn_type": "spark",
                "host": "spark://127.0.0.1",
                "port": 7,
                "password": TOKEN,
                "extra": {"deploy-mode": "cluster", "rest-port": port, "master-ui-url": url},
            }
        )

        def requests_seen() -> int:
            return int(_http_json(f"{url}/__stats").get("total", 0))

        async def schedule(spread: float) -> dict[str, float]:
            return await asyncio.to_thread(
                _http_json, f"{url}/__schedule", {"start": time.time() + 0.5, "spread": spread}
            )

        result = asyncio.run(
            _measure(
                count=count,
                mode=mode,
                submission_ids=list(drivers),
                requests_seen=requests_seen,
                schedule=schedule,
                poll=args.poll,
                steady=args.steady,
                spread=args.spread,
                ramp_timeout=args.ramp_timeout,
            )
        )
        result["master"] = "fake"
        return result
    finally:
        proc.terminate()
        proc.wait(10)


# -- the real master ----------------------------------------------------------------------------


def run_real(counts: list[int], args: argparse.Namespace, work: Path) -> list[dict[str, Any]]:
    from airflow.sdk.exceptions import TaskDeferred

    from airflow_shared_stream.spark.operators import DeferrableSparkSubmitOperator
    from tests.support.flaky_proxy import FlakyProxy
    from tests.support.spark import MemoryTaskStateStore, spark_client_env, spark_standalone_cluster

    os.environ.update(spark_client_env())
    apps = ROOT / "tests" / "integration" / "spark" / "apps"
    results = []
    with spark_standalone_cluster(work / "cluster") as cluster:
        for count in counts:
            for mode in MODES:
                with FlakyProxy(cluster.rest_port) as rest, FlakyProxy(cluster.master_ui_port) as ui:
                    os.environ[f"AIRFLOW_CONN_{CONN_ID.upper()}"] = cluster.connection_json(
                        **{"rest-port": rest.port, "master-ui-url": f"http://127.0.0.1:{ui.port}"}
                    )
                    sleep_for = args.steady + 40
                    pid_files = [work / f"real-{count}-{mode}-{i}.pid" for i in range(2)]
                    ids = []
                    for pid_file in pid_files:
                        op = DeferrableSparkSubmitOperator(
                            task_id="bench",
                            conn_id=CONN_ID,
                            application=str(apps / "sleeper.py"),
                            application_args=[str(pid_file), str(sleep_for)],
                            deferrable=True,
                            conf={"spark.ui.enabled": "false", "spark.driver.memory": "512m"},
                        )
                        try:
                            op.execute({"task_state_store": MemoryTaskStateStore()})
                        except TaskDeferred as deferred:
                            ids.append(deferred.trigger.submission_id)
                    for pid_file in pid_files:  # both drivers' Python processes are running
                        until = time.monotonic() + 120
                        while not pid_file.exists() and time.monotonic() < until:
                            time.sleep(0.2)

                    def requests_seen() -> int:
                        return rest.forwarded + ui.forwarded

                    async def schedule(
                        spread: float,
                        ids: list[str] = ids,
                        pids: list[Path] = pid_files,
                        sleep_for: float = sleep_for,
                    ) -> dict[str, float]:
                        # The drivers end on their own: start (pid file) + sleep.
                        return {sid: p.stat().st_mtime + sleep_for for sid, p in zip(ids, pids, strict=True)}

                    result = asyncio.run(
                        _measure(
                            count=count,
                            mode=mode,
                            submission_ids=ids,
                            requests_seen=requests_seen,
                            schedule=schedule,
                            poll=args.poll,
                            steady=args.steady,
                            spread=0.0,
                            ramp_timeout=args.ramp_timeout,
                        )
                    )
                result["master"] = "real"
                results.append(result)
                print(json.dumps(result), flush=True)
    return results


# -- report -------------------------------------------------------------------------------------


def _table(results: list[dict[str, Any]]) -> str:
    lines = [
        "| master | triggers | mode | requests/s to master | triggerer CPU (share of one core) "
        "| finish-to-event p50 / p95 (s) | events |",
        "| --- | ---: | --- | ---: | ---: | ---: | ---: |",
    ]
    for r in results:
        lines.append(
            f"| {r['master']} | {r['triggers']:,} | {r['mode']} | {r['requests_per_s']:.1f} "
            f"| {100 * r['cpu_fraction_of_one_core']:.1f}% "
            f"| {r['finish_to_event_p50_s']} / {r['finish_to_event_p95_s']} | {r['events']:,} |"
        )
    return "\n".join(lines)


def _plot(results: list[dict[str, Any]], path: Path, poll: float) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fake = [r for r in results if r["master"] == "fake"]
    fig, axes = plt.subplots(1, 3, figsize=(13, 4))
    panels = [
        ("requests_per_s", "requests/s to the master", 2.0),
        ("cpu_fraction_of_one_core", "triggerer CPU (fraction of one core)", 0.05),
        ("finish_to_event_p95_s", "finish-to-event p95 (s)", poll + 0.5),
    ]
    for ax, (key, title, target) in zip(axes, panels, strict=True):
        for mode, marker in (("per-trigger", "o"), ("shared", "s")):
            # A zero (nothing measured in the window) has no place on a log axis: the table says it.
            pts = [(r["triggers"], r[key]) for r in fake if r["mode"] == mode and r[key]]
            if pts:
                ax.plot(*zip(*pts, strict=True), marker=marker, label=mode)
        ax.axhline(target, color="grey", linestyle="--", linewidth=1, label="target at 1,000")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("waiting triggers on one master")
        ax.set_title(title)
        ax.grid(True, which="both", alpha=0.3)
    axes[0].legend()
    fig.suptitle(f"Deferred Spark tasks on one master, poll interval {poll:g} s (recording master)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    parser.add_argument("--counts", type=int, nargs="+", default=[1, 100, 1000, 5000])
    parser.add_argument("--real-counts", type=int, nargs="+", default=[1, 100])
    parser.add_argument("--no-real", action="store_true", help="skip the real standalone cluster")
    parser.add_argument("--poll", type=float, default=1.0, help="each trigger's poll interval (s)")
    parser.add_argument("--steady", type=float, default=10.0, help="measurement window while all wait (s)")
    parser.add_argument("--spread", type=float, default=5.0, help="drivers finish over this many seconds")
    parser.add_argument("--ramp-timeout", type=float, default=120.0)
    parser.add_argument("--no-plot", action="store_true", help="skip the PNG (no matplotlib needed)")
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "spark_status_poller"))
    args = parser.parse_args()
    results: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="spark-poller-bench-") as tmp:
        work = Path(tmp)
        for count in args.counts:
            for mode in MODES:
                result = run_fake(count, mode, args, work)
                print(json.dumps(result), flush=True)
                results.append(result)
        if not args.no_real:
            results.extend(run_real(args.real_counts, args, work))
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    machine = describe(["apache-airflow", "httpx", "pyspark"])
    settings = (
        f"- poll interval {args.poll:g} s, steady window {args.steady:g} s, "
        f"drivers finish spread over {args.spread:g} s (fake master)"
    )
    out.with_suffix(".json").write_text(
        json.dumps({"machine": machine, "settings": vars(args), "results": results}, indent=2) + "\n"
    )
    out.with_suffix(".md").write_text(f"{machine}\n{settings}\n\n{_table(results)}\n")
    if not args.no_plot:
        _plot(results, out.with_suffix(".png"), args.poll)
    print(_table(results))


if __name__ == "__main__":
    main()
