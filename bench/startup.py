"""
A stream's start-up in a real triggerer: trigger start -> stream consuming, and the longest loop block.

Issue 50. Per cell: a fresh Airflow deployment (SQLite; dag-processor and triggerer only: no
scheduler or api-server, which the measurement does not need and which would load the machine),
serving one Dag whose ``--watchers`` assets watch ONE stream through the trigger under test. A
message (a canary with its own id) is published every ``--period`` seconds from the moment the
first trigger starts. Recorded:

* ``start -> consuming``: from the triggerer logging "trigger ... starting" for the watcher to the
  first asset event of that watcher (the slowest watcher is reported). An asset event is written
  after the message was consumed, matched and persisted, so this is an upper bound on the time
  to consuming;
* the supervisor's and the runner's CPU seconds over the first ``--window`` seconds after the
  first trigger started (``/proc``);
* the longest event-loop block the triggerer itself reported ("Triggerer's async thread was
  blocked for X seconds", threshold lowered to 0.2 s) and its "deadlocked" lines;
* steady state: publish -> asset event for the messages published after every watcher consumed.

Machine states: ``idle`` (whatever else runs on the machine: its load is recorded) and ``busy``
(8 processes spinning a core each, beside it). Triggers: ours for each broker, the official
provider's trigger of the same broker where installed (Amazon ``MessageQueueTrigger`` over SQS,
Apache Kafka ``AwaitMessageTrigger``), and a trivial event trigger (``bench.startup_trivial``)
that fires at once: what the triggerer itself costs.

Results: bench/results/startup.md (``--out``) and a .json beside it.

Run: .venv/bin/python bench/startup.py [--triggers sqs kafka trivial] [--states idle busy]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import asdict, dataclass, field
from datetime import datetime
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.machine import describe  # noqa: E402
from bench.startup_rigs import RIGS  # noqa: E402
from tests.support.airflow import AirflowDeployment  # noqa: E402
from tests.support.machine_load import busy_processes  # noqa: E402

BLOCKED = re.compile(r"async thread was blocked for ([0-9.]+) seconds")
SLOW_CALLBACK = re.compile(r"Executing (.{0,300}?) took ([0-9.]+) seconds")
"""asyncio's own slow-callback line (``--asyncio-debug``): which callback or task step held the loop."""
STREAM_OPEN = re.compile(
    r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d+Z?).{0,40}"
    r"(?:(?:SQS|Pub/Sub|Service Bus) shared stream open|Kafka shared stream reading all)"
)
"""The stream's own line logged when it is connected and about to make its first receive."""
DEADLOCKED = re.compile(r"appears deadlocked: no communication received for ([0-9.]+)s")
BUSY_PROCESSES = 8


@dataclass
class Cell:
    trigger: str
    state: str
    watchers: int
    load_before: float
    load_after: float = 0.0
    start_to_consuming: list[float] = field(default_factory=list)
    """Per watcher: its trigger's start to its first asset event, seconds."""
    start_to_open: float | None = None
    """The first trigger's start to the stream's open line (connected, first receive next), seconds."""
    supervisor_cpu: float = 0.0
    runner_cpu: float = 0.0
    """The supervisor's children: the trigger runner, and the triggerer's idle log server."""
    longest_block: float = 0.0
    deadlocked: list[float] = field(default_factory=list)
    steady_latency: list[float] = field(default_factory=list)
    error: str | None = None
    slow_callbacks: list[str] = field(default_factory=list)
    """With ``--asyncio-debug``: the slowest steps asyncio itself reported, longest first."""


# -- the Dag of each trigger ------------------------------------------------------------------

DAG_TEMPLATE = """
from airflow.sdk import DAG, Asset, AssetWatcher
from airflow.providers.standard.operators.empty import EmptyOperator

{imports}


def _trigger(n):
    return {trigger}


assets = [
    Asset(f"startup_{{n}}", watchers=[AssetWatcher(name=f"startup_w{{n}}", trigger=_trigger(n))])
    for n in range({watchers})
]
schedule = assets[0]
for asset in assets[1:]:
    schedule = schedule | asset

with DAG(dag_id="startup_probe", schedule=schedule, catchup=False, max_active_runs=1):
    EmptyOperator(task_id="nothing")
"""


# -- measuring ----------------------------------------------------------------------------------


def _cpu_seconds(pid: int) -> float:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _children(pid: int) -> list[int]:
    try:
        return [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def _children_cpu(pid: int) -> float:
    """CPU seconds of the supervisor's children: the trigger runner (and the log server, idle)."""
    return sum(_cpu_seconds(child) for child in _children(pid))


def _trigger_starts(log_text: str) -> dict[int, float]:
    """Trigger id -> when the triggerer logged its start (epoch seconds)."""
    starts: dict[int, float] = {}
    for line in log_text.splitlines():
        if "starting" not in line or "trigger" not in line:
            continue
        found = re.search(r"trigger (?:ID (\d+)|.*\(ID (\d+)\)) starting", line)
        stamp = re.search(r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d+Z?)", line)
        if found and stamp:
            starts.setdefault(int(found.group(1) or found.group(2)), _epoch(stamp.group(1)))
    return starts


def _epoch(stamp: str) -> float:
    return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


def _sampler_env(args: argparse.Namespace, name: str, state: str) -> dict[str, str]:
    """With ``--sample-loop``: the loop sampler (``bench/loop_sampler``) in every forked child."""
    if args.sample_loop is None:
        return {}
    out = args.sample_loop / f"{name}-{state}"
    out.mkdir(parents=True, exist_ok=True)
    return {
        "PYTHONPATH": f"{REPO / 'bench' / 'loop_sampler'}{os.pathsep}{REPO}",
        "LOOP_SAMPLER_OUT": str(out),
    }


def run_cell(name: str, state: str, watchers: int, args: argparse.Namespace) -> Cell:
    cell = Cell(trigger=name, state=state, watchers=watchers, load_before=os.getloadavg()[0])
    with contextlib.ExitStack() as stack:
        rig = RIGS[name](stack)
        home = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix=f"startup-{name}-")))
        dags = home / "dags"
        dags.mkdir()
        (dags / "startup_probe.py").write_text(
            DAG_TEMPLATE.format(imports=rig.imports, trigger=rig.trigger, watchers=watchers)
        )
        airflow = AirflowDeployment(
            home=home / "airflow",
            dags_folder=dags,
            env={
                **rig.env,
                "PYTHONPATH": str(REPO),
                **_sampler_env(args, name, state),
                "AIRFLOW__TRIGGERER__BLOCKED_MAIN_THREAD_WARNING_THRESHOLD": "0.2",
                "AIRFLOW__LOGGING__LOGGING_LEVEL": "INFO",
                **({"PYTHONASYNCIODEBUG": "1"} if args.asyncio_debug else {}),
            },
        )
        airflow.migrate()
        if state == "busy":
            stack.enter_context(busy_processes(BUSY_PROCESSES))
        stack.callback(airflow.stop)
        airflow.start_component("dag-processor")
        triggerer = airflow.start_component("triggerer")
        published: dict[str, float] = {}
        stop = threading.Event()
        triggers_started = threading.Event()

        def publish() -> None:
            # From the first trigger's start: earlier messages would wait on a queue (SQS) as a
            # backlog that the steady state then measures.
            while not triggers_started.wait(0.05) and not stop.is_set():
                pass
            while not stop.is_set():
                canary = uuid.uuid4().hex[:12]
                published[canary] = time.time()
                with contextlib.suppress(Exception):
                    rig.publish({"canary": canary})
                stop.wait(args.period)

        publisher = threading.Thread(target=publish, daemon=True)
        stack.callback(publisher.join)
        stack.callback(stop.set)
        publisher.start()
        deadline = time.monotonic() + args.timeout
        first_start: float | None = None
        cpu_at_start = (0.0, 0.0)
        firsts: dict[str, float] = {}
        try:
            while time.monotonic() < deadline:
                airflow.check_alive()
                log_text = airflow.log_path("triggerer").read_text(errors="replace")
                starts = _trigger_starts(log_text)
                if starts and first_start is None:
                    first_start = time.time()
                    triggers_started.set()
                    cpu_at_start = (_cpu_seconds(triggerer.pid), _children_cpu(triggerer.pid))
                events = airflow.asset_events()
                for event in events:
                    firsts.setdefault(event.asset_name, event.timestamp.timestamp())
                if len(firsts) >= watchers and first_start is not None:
                    break
                time.sleep(0.2)
            else:
                cell.error = f"only {len(firsts)} of {watchers} watchers consumed within {args.timeout} s"
            ids = airflow.watcher_trigger_ids()
            starts = _trigger_starts(airflow.log_path("triggerer").read_text(errors="replace"))
            for n in range(watchers):
                trigger_id = ids.get(f"startup_w{n}")
                started = starts.get(trigger_id) if trigger_id is not None else None
                first = firsts.get(f"startup_{n}")
                if started is not None and first is not None:
                    cell.start_to_consuming.append(round(first - started, 2))
            # Steady state and the CPU window: keep publishing until the window has passed.
            if first_start is not None:
                steady_from = time.time()
                while time.time() < max(first_start + args.window, steady_from + args.steady):
                    time.sleep(0.5)
                cell.supervisor_cpu = round(_cpu_seconds(triggerer.pid) - cpu_at_start[0], 2)
                cell.runner_cpu = round(_children_cpu(triggerer.pid) - cpu_at_start[1], 2)
                time.sleep(2 * args.period + 2)
                for event in airflow.asset_events():
                    canary = rig.payload_id(event.payload)
                    sent = published.get(canary or "")
                    if sent is not None and sent >= steady_from:
                        cell.steady_latency.append(round(event.timestamp.timestamp() - sent, 3))
        except Exception as exc:
            cell.error = f"{type(exc).__name__}: {exc}"[:500]
        log_text = airflow.log_path("triggerer").read_text(errors="replace")
        all_starts = _trigger_starts(log_text)
        opened = STREAM_OPEN.search(log_text)
        if opened and all_starts:
            cell.start_to_open = round(_epoch(opened.group(1)) - min(all_starts.values()), 2)
        cell.longest_block = max((float(x) for x in BLOCKED.findall(log_text)), default=0.0)
        slow = sorted(((float(t), what) for what, t in SLOW_CALLBACK.findall(log_text)), reverse=True)
        cell.slow_callbacks = [f"{t:.2f} s {what}" for t, what in slow[:5]]
        cell.deadlocked = [float(x) for x in DEADLOCKED.findall(log_text)]
        cell.load_after = os.getloadavg()[0]
        if args.keep_logs:
            keep = args.out.parent / "startup-logs" / f"{name}-{state}.log"
            keep.parent.mkdir(parents=True, exist_ok=True)
            keep.write_text(log_text)
    return cell


# -- the results file ---------------------------------------------------------------------------


def _p(values: list[float], q: float) -> str:
    if not values:
        return "-"
    ordered = sorted(values)
    return f"{ordered[min(len(ordered) - 1, int(q * len(ordered)))]:.2f}"


def render(cells: list[Cell], header: str) -> str:
    lines = [
        header,
        "",
        "| trigger | machine | watchers | load before/after | start -> stream open (s) "
        "| start -> consuming, slowest (s) "
        "| supervisor CPU (s) | runner CPU (s) | longest loop block (s) | deadlocked | steady p50/p95 (s) |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for c in cells:
        slowest = f"{max(c.start_to_consuming):.2f}" if c.start_to_consuming else "-"
        lines.append(
            f"| {c.trigger} | {c.state} | {c.watchers} | {c.load_before:.1f} / {c.load_after:.1f} | "
            f"{'-' if c.start_to_open is None else f'{c.start_to_open:.2f}'} | "
            f"{slowest}{' (' + c.error + ')' if c.error else ''} | {c.supervisor_cpu:.1f} | "
            f"{c.runner_cpu:.1f} | {c.longest_block:.2f} | "
            f"{', '.join(f'{d:.0f} s' for d in c.deadlocked) or 'no'} | "
            f"{_p(c.steady_latency, 0.5)} / {_p(c.steady_latency, 0.95)} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    default_triggers = ["trivial", "sqs", "kafka", "pubsub", "servicebus"]
    parser.add_argument("--triggers", nargs="+", choices=sorted(RIGS), default=default_triggers)
    parser.add_argument("--states", nargs="+", choices=("idle", "busy"), default=["idle", "busy"])
    parser.add_argument("--watchers", type=int, default=3)
    parser.add_argument("--period", type=float, default=0.5, help="seconds between two messages")
    parser.add_argument("--window", type=float, default=30.0, help="CPU window after the first start")
    parser.add_argument("--steady", type=float, default=10.0, help="steady-state seconds after consuming")
    parser.add_argument("--timeout", type=float, default=240.0)
    parser.add_argument("--keep-logs", action="store_true")
    parser.add_argument(
        "--asyncio-debug",
        action="store_true",
        help="run the triggerer with PYTHONASYNCIODEBUG=1 and record asyncio's slow-callback lines "
        "(debug mode slows the loop: diagnosis, not figures)",
    )
    parser.add_argument(
        "--sample-loop",
        type=Path,
        metavar="DIR",
        help="sample the event loop's stack in the triggerer's forked runner and write each busy "
        "run over 0.15 s to DIR/<trigger>-<state>/<pid>.txt (diagnosis, not figures)",
    )
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "startup.md")
    args = parser.parse_args(argv)
    cells: list[Cell] = []
    for state in args.states:
        for name in args.triggers:
            cell = run_cell(name, state, args.watchers, args)
            print(json.dumps(asdict(cell)), flush=True)
            cells.append(cell)
    header = describe(["apache-airflow", "aiobotocore", "aiokafka", "moto", "noida-db"])
    args.out.write_text(render(cells, header))
    args.out.with_suffix(".json").write_text(json.dumps([asdict(c) for c in cells], indent=1))
    print(render(cells, header))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
