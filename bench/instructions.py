"""
CPU instructions per message, ours against the manager's in-memory ceiling, counted by callgrind.

Why a second measure beside bench/watchers.py: on this workplace's machines (virtual, two cores,
shared hosts) the same cell's messages/s moved by a third between repeats minutes apart, and the
CPU seconds with it; a target of "80% of the ceiling" read off such numbers is decided by the
neighbours. ``valgrind --tool=callgrind`` counts the instructions the triggerer's process
executes, which do not depend on what else the machine runs (the same count to 0.1% over
repeats here). It is a proxy for the CPU-bound cells only: a cell that waits on its broker is
not faster for fewer instructions, which is why watchers.py stays the benchmark of record.

Method: each variant of bench/watchers.py runs under callgrind with instrumentation switched on
only while the watchers run (``drive_shared``: not the imports, the broker's start, the topic's
preparation), once with M and once with 2M messages; the difference divided by M is the
instructions per message, with every fixed cost (subscribing, the cohort grace period, the
first receive) cancelled out. The brokers run in processes of their own, outside valgrind.

Run: ``.venv/bin/python bench/instructions.py [--cells ceiling:1 pubsub:1:3 ...] [--repeats N]``
(``:3`` or ``--repeats``: measure a cell three times and show the median; with a broker the count
moves by 2-3% between runs, the in-memory variants repeat to 0.1%). Writes
``bench/results/instructions.md`` and ``.json``. Needs valgrind (``callgrind_control``); a cell
takes about a minute of valgrind per 1,000 messages at one watcher.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.machine import describe  # noqa: E402

CELLS = (
    "ceiling:1",
    "template:1",
    "pubsub:1:3",
    "kafka:1:3",
    "kafka-3p:1:3",
    "ceiling:10",
    "pubsub:10",
    "kafka:10",
)
"""What a default run measures: ``variant:watchers[:repeats]``; ``kafka`` runs on Tansu (see
watchers.py). The one-watcher broker cells, the ones near the 80% target, are measured three
times."""
MESSAGES = {1: 1000, 10: 300, 100: 100}
"""M per watcher count (the second run takes 2M)."""


# -- one measured run (inside valgrind) ------------------------------------------------------


def _instrumentation(on: bool) -> None:
    subprocess.run(
        ["callgrind_control", "-i", "on" if on else "off", str(os.getpid())],
        check=True,
        capture_output=True,
    )


async def _measure(variant: str, watchers: int, messages: int) -> dict[str, Any]:
    """Run ``variant`` once to warm up, then again with callgrind counting ``drive_shared`` only."""
    from bench import watchers as w

    original = w.drive_shared
    counting = False

    async def counted(*args: Any, **kwargs: Any) -> None:
        if counting:
            _instrumentation(True)
        try:
            await original(*args, **kwargs)
        finally:
            if counting:
                _instrumentation(False)

    w.drive_shared = counted  # type: ignore[assignment]
    settings = argparse.Namespace(budget=1800.0, sync=0.0, kafka_broker="tansu", pubsub_pull_cap=None)
    broker_name, _, partitions_text = variant.partition("-")
    partitions = int(partitions_text.rstrip("p") or 1)

    async def run_once(count: int) -> Any:
        if broker_name in ("ceiling", "template"):
            cell = w.Cell(broker_name, broker_name, watchers, count)
            await (w.run_ceiling if broker_name == "ceiling" else w.run_template)(cell, 1800.0, 0.0)
            return cell
        if broker_name == "kafka":
            return await broker.run("ours", watchers, count, partitions)
        return await broker.run("ours", watchers, count)

    broker: Any = None
    if broker_name in ("pubsub", "kafka", "sqs", "servicebus"):
        broker = w.BROKER_CLASSES[broker_name](settings).__enter__()
    try:
        await run_once(min(messages, 200))
        counting = True
        cell = await run_once(messages)
    finally:
        if broker is not None:
            broker.__exit__(None, None, None)
    return {"delivered": cell.delivered, "error": cell.error}


# -- the driver --------------------------------------------------------------------------------


def _callgrind(variant: str, watchers: int, messages: int) -> int:
    """Instructions callgrind counted while ``variant`` ran ``messages`` messages."""
    with tempfile.TemporaryDirectory(prefix="bench-instructions-") as tmp:
        out = Path(tmp) / "callgrind.out"
        completed = subprocess.run(
            [
                "valgrind",
                "--tool=callgrind",
                "--instr-atstart=no",
                f"--callgrind-out-file={out}",
                sys.executable,
                __file__,
                "--measure",
                variant,
                str(watchers),
                str(messages),
            ],
            capture_output=True,
            text=True,
            check=False,
        )
        collected = re.search(r"Collected : (\d+)", completed.stderr)
        result = completed.stdout.strip().splitlines()[-1:] or ["{}"]
        outcome = json.loads(result[0]) if result[0].startswith("{") else {}
        if completed.returncode != 0 or collected is None or outcome.get("error"):
            raise RuntimeError(
                f"{variant}:{watchers} with {messages} messages failed (exit {completed.returncode}, "
                f"{outcome.get('error')}): {completed.stderr[-2000:]}"
            )
        if outcome.get("delivered") != messages * watchers:
            raise RuntimeError(
                f"{variant}:{watchers} delivered {outcome.get('delivered')} of {messages * watchers}"
            )
        return int(collected.group(1))


def per_message(variant: str, watchers: int, repeats: int = 1) -> dict[str, Any]:
    """
    Instructions per message of one cell: the median of ``repeats`` measurements.

    With a broker the count moves by 2-3% between runs of the same code (how many messages a
    receive brings depends on the broker's timing, and so does the work per message); the
    median of a few, with every repeat recorded, is what a before/after comparison can use.
    """
    m = MESSAGES.get(watchers, 300)
    started = time.monotonic()
    runs = []
    for _ in range(repeats):
        single, double = _callgrind(variant, watchers, m), _callgrind(variant, watchers, 2 * m)
        runs.append({"instructions": [single, double], "per_message": (double - single) / m})
    median = sorted(runs, key=lambda run: run["per_message"])[(len(runs) - 1) // 2]
    return {
        "variant": variant,
        "watchers": watchers,
        "messages": [m, 2 * m],
        "instructions": median["instructions"],
        "per_message": median["per_message"],
        "repeats": [round(run["per_message"]) for run in runs],
        "seconds": round(time.monotonic() - started),
    }


def render(rows: list[dict[str, Any]]) -> str:
    ceilings = {r["watchers"]: r["per_message"] for r in rows if r["variant"] == "ceiling"}
    lines = [
        "# Instructions per message: ours against the manager's ceiling (callgrind)",
        "",
        "Produced by `bench/instructions.py`: instructions of the triggerer's process while the "
        "watchers ran, counted by `valgrind --tool=callgrind`, (count at 2M messages - count at M) / M. "
        "`ceiling / ours` is the share of the ceiling's speed ours would reach if both were CPU-bound "
        "(the target is 80%). Kafka runs on Tansu. Persistence confirmed at once, as in watchers.py. "
        "With repeats, each row is the median repeat; `repeats` lists them all.",
        "",
        describe(["apache-airflow", "aiokafka", "google-cloud-pubsub", "grpcio"]),
        f"- valgrind: {_valgrind_version()}",
        "",
        "| variant | watchers | M | instructions / message | ceiling / ours | repeats | valgrind s |",
        "| --- | ---: | ---: | ---: | ---: | --- | ---: |",
    ]
    for row in rows:
        ceiling = ceilings.get(row["watchers"])
        share = "" if row["variant"] == "ceiling" or not ceiling else f"{ceiling / row['per_message']:.0%}"
        lines.append(
            f"| {row['variant']} | {row['watchers']} | {row['messages'][0]:,} | "
            f"{row['per_message']:,.0f} | {share} | "
            f"{' / '.join(f'{r:,}' for r in row.get('repeats', ()))} | {row['seconds']} |"
        )
    return "\n".join(lines) + "\n"


def _valgrind_version() -> str:
    return subprocess.run(
        ["valgrind", "--version"], capture_output=True, text=True, check=False
    ).stdout.strip()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--cells",
        nargs="+",
        default=list(CELLS),
        help="variant:watchers[:repeats], e.g. pubsub:10 or pubsub:1:3",
    )
    parser.add_argument(
        "--measure", nargs=3, metavar=("VARIANT", "WATCHERS", "MESSAGES"), help=argparse.SUPPRESS
    )
    parser.add_argument("--output-dir", type=Path, default=ROOT / "bench" / "results")
    parser.add_argument(
        "--repeats", type=int, default=1, help="times to measure each cell (its own :repeats wins)"
    )
    args = parser.parse_args(argv)
    if args.measure:
        from bench.watchers import quiet_loggers

        quiet_loggers()  # as bench/watchers.py runs
        variant, watchers, messages = args.measure
        print(json.dumps(asyncio.run(_measure(variant, int(watchers), int(messages)))), flush=True)
        return
    if shutil.which("valgrind") is None or shutil.which("callgrind_control") is None:
        raise SystemExit("bench/instructions.py needs valgrind and callgrind_control on PATH")
    rows = []
    for spec in args.cells:
        variant, _, rest = spec.partition(":")
        watchers, _, repeats = rest.partition(":")
        row = per_message(variant, int(watchers or 1), int(repeats or args.repeats))
        print(json.dumps(row), flush=True)
        rows.append(row)
    args.output_dir.mkdir(parents=True, exist_ok=True)
    (args.output_dir / "instructions.md").write_text(render(rows))
    (args.output_dir / "instructions.json").write_text(json.dumps(rows, indent=1))
    print(f"wrote {args.output_dir / 'instructions.md'}")


if __name__ == "__main__":
    main()
