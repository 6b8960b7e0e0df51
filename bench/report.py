"""
The result files of bench/watchers.py: the markdown table, its notes, and merging re-measured cells.
"""

from __future__ import annotations

import argparse
import collections
import json
import math
from pathlib import Path

from bench.harness import Cell
from bench.machine import Settled, describe

ROWS = ("ours", "ceiling", "template", "bare", "per-watcher", "official")


def report(cell: Cell) -> None:
    rpm = cell.requests_per_message
    print(
        f"{cell.broker:10s} N={cell.watchers:<4d} {cell.variant:12s} "
        f"{cell.messages_per_second:9.1f} msg/s "
        f"{cell.events_per_second:9.1f} ev/s cpu/1k={cell.cpu_per_1000:6.2f}s "
        f"rss={cell.rss_growth_kib:8.1f}KiB req/msg={'-' if rpm is None else f'{rpm:.3f}'} "
        f"load={cell.load:.1f} {cell.requests} {cell.error or ''}",
        flush=True,
    )


REQUEST_TARGETS = {
    "sqs": "requests / message target <= 0.25 (floor 0.2: one ReceiveMessage and one "
    "DeleteMessageBatch per 10 messages, SQS's batch limit)",
    "pubsub": "requests / message target <= 0.05 (one pull of up to 1,000 and one acknowledge of "
    "up to 1,000 ack ids would be 0.002; the credit window, 500 by default, and the emulator's "
    "pulls of at most 100 make it 0.02 in practice, as the bare loop shows)",
    "servicebus": "requests / message target <= 0.05 (an ACK batch of up to 100 messages goes out "
    "as one disposition per run of consecutive deliveries, and a receive grants credit for up to "
    "the free part of the window: about 0.01 settle and 0.01 receive per message; the bare loop's "
    "complete_message is one disposition per message; lock renewals only for messages held "
    "longer than a third of the lock)",
    "kafka": "requests are not counted (see docs/benchmarks.rst)",
}


def _by_kind(cell: Cell) -> str:
    done = cell.delivered / cell.fanout
    if not cell.requests or not done:
        return ""
    return ", ".join(f"{kind} {count / done * 1000:,.0f}" for kind, count in sorted(cell.requests.items()))


def table_run(cells: list[Cell]) -> str | None:
    """The run a table is from: its earliest cell's (later ones re-measured cells with ``--update``)."""
    return min((c.run for c in cells if c.run), default=None)  # "YYYY-MM-DD HH:MM UTC" sorts by time


def render(broker: str, cells: list[Cell], args: argparse.Namespace, versions: list[str]) -> str:
    """The markdown table of ``cells``."""
    run = table_run(cells)
    # Tables of runs from before the broker's CPU was measured keep their columns.
    broker_cpu = any(c.broker_cpu_seconds is not None for c in cells)
    lines = [
        f"# {broker}: watchers on one stream, against the anchors",
        "",
        "Produced by `bench/watchers.py` (one run, variants taking turns per watcher count"
        + (
            f", {args.repeats} times; each row is the median repeat, the note gives every repeat's messages/s"
            if args.repeats > 1
            else ""
        )
        + "); "
        f"persistence confirmed {'at once' if args.sync <= 0 else f'every {args.sync:g} s'}; "
        f"time budget per cell {args.budget:.0f} s"
        + (
            f"; the broker pinned to core {args.pin_broker}, the benchmark's process to the others"
            if args.pin_broker is not None
            else ""
        )
        + (
            f"; NOT on Google's emulator: on bench/fake_pubsub.py, which hands out up to "
            f"{args.pubsub_pull_cap:,} messages per pull"
            if args.pubsub_pull_cap and broker.startswith("pubsub")
            else ""
        )
        + ". "
        + REQUEST_TARGETS.get(broker.split("-")[0], "")
        + ". `x N=1`: requests / message against the same variant at 1 watcher (flat is 1.0).",
        "",
        describe(versions, run=run),
        "",
        "| watchers | variant | messages | messages/s | trigger events/s | % of lower ceiling "
        "| CPU s / 1,000 msgs "
        + ("| broker CPU s / 1,000 msgs " if broker_cpu else "")
        + "| RSS growth / watcher (KiB) | requests / message | x N=1 "
        "| requests per 1,000 messages | load (1 min) | note |",
        "| ---: | --- | ---: | ---: | ---: | ---: | ---: | "
        + ("---: | " if broker_cpu else "")
        + "---: | ---: | ---: | --- | ---: | --- |",
    ]
    by_n: dict[int, dict[str, Cell]] = collections.defaultdict(dict)
    held: list[Cell] = []
    for cell in cells:
        if cell.variant == "in-flight":
            held.append(cell)
        else:
            by_n[cell.watchers][cell.variant] = cell
    at_one = by_n.get(1, {})
    for n, row in sorted(by_n.items()):
        ceilings = [row[v].messages_per_second for v in ("ceiling", "bare") if v in row]
        lower = min(ceilings) if ceilings else float("nan")
        for variant in ROWS:
            if variant not in row:
                continue
            c = row[variant]
            rpm = c.requests_per_message
            base = at_one[variant].requests_per_message if variant in at_one else None
            fold = f"{rpm / base:,.1f}" if rpm is not None and base else ""
            share = c.messages_per_second / lower if lower and variant not in ("ceiling", "bare") else None
            columns = [
                str(n),
                variant,
                str(c.delivered // c.fanout),
                f"{c.messages_per_second:,.1f}",
                f"{c.events_per_second:,.1f}",
                "" if share is None else f"{share:.0%}",
                _cpu(c.cpu_per_1000),
            ]
            if broker_cpu:
                columns.append("" if c.broker_cpu_per_1000 is None else _cpu(c.broker_cpu_per_1000))
            columns += [
                f"{c.rss_growth_kib:,.0f}",
                "" if rpm is None else f"{rpm:.3f}",
                fold,
                _by_kind(c),
                f"{c.load:.1f}",
                _note(c, run),
            ]
            lines.append("| " + " | ".join(columns) + " |")
    for c in held:
        lines += [
            "",
            f"Memory per in-flight trigger event ({c.watchers} watchers holding {c.delivered // c.fanout} "
            f"unpersisted messages, {c.delivered} trigger events): "
            f"{c.heap_per_event_bytes or 0:,.0f} bytes of Python heap (tracemalloc), "
            f"{c.rss_growth_kib * 1024:,.0f} bytes of RSS growth; load {c.load:.1f}"
            + (f"; {c.error}" if c.error else "")
            + ".",
        ]
    lines.append("")
    return "\n".join(lines)


def _cpu(seconds: float) -> str:
    """CPU s per 1,000 messages to three decimals below one second (one watcher spends about 0.05)."""
    if math.isnan(seconds):
        return "n/a"
    return f"{seconds:,.3f}" if seconds < 1 else f"{seconds:,.2f}"


SETTLE_NOTED = 2.0
"""A wait for the broker to go quiet this long (or longer) is noted in the cell's row."""


def _note(cell: Cell, run: str | None) -> str:
    """
    The cell's error, if any, the later run that re-measured it (``--update``), a broker that was
    slow to go quiet before it, and every repeat's rate.
    """
    notes = [cell.error] if cell.error else []
    if cell.run is not None and cell.run != run:
        notes.append(f"re-measured in the run of {cell.run}")
    settled = cell.settled
    if settled is not None and not settled.idle:
        busy = f"{settled.busy:.0%} of a core"
        notes.append(f"the broker was still busy ({busy}) after {settled.seconds:.0f} s")
    elif settled is not None and settled.seconds >= SETTLE_NOTED:
        notes.append(f"the broker took {settled.seconds:.0f} s to go quiet before it")
    if cell.repeats:
        notes.append("repeats: " + " / ".join(f"{rate:,.0f}" for rate in cell.repeats))
    return "; ".join(notes)


def _merge(previous: Path, cells: list[Cell]) -> list[Cell]:
    """
    An earlier table's cells, with those re-measured now (same variant and N) replaced. Each kept
    cell keeps its run; tables written before runs were recorded per cell name theirs in the
    markdown's ``run:`` line.
    """
    fresh = {(c.variant, c.watchers) for c in cells}
    fields = {f for f in Cell.__dataclass_fields__}
    kept = []
    for row in json.loads(previous.read_text())["cells"]:
        if (row["variant"], row["watchers"]) not in fresh:
            cell = Cell(**{k: v for k, v in row.items() if k in fields})
            if isinstance(cell.settled, dict):
                cell.settled = Settled(**cell.settled)
            kept.append(cell)
    if any(cell.run is None for cell in kept):
        markdown_run = _run_line(previous.with_suffix(".md"))
        for cell in kept:
            cell.run = cell.run or markdown_run
    return kept + cells


def _run_line(markdown: Path) -> str:
    """The ``- run: ...`` line's date of a table (:func:`bench.machine.describe` writes it)."""
    prefix = "- run: "
    for line in markdown.read_text().splitlines():
        if line.startswith(prefix):
            return line[len(prefix) :].strip()
    raise ValueError(f"{markdown} has no '{prefix}' line: cannot tell which run its cells are from")
