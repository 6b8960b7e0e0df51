"""
Describe the machine and package versions a benchmark ran on, for its results file, and wait
for the broker to go quiet between cells.
"""

from __future__ import annotations

import asyncio
import os
import platform
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from importlib.metadata import PackageNotFoundError, version
from typing import Any


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _memory_gib() -> str:
    try:
        with open("/proc/meminfo") as meminfo:
            kib = int(meminfo.readline().split()[1])
            return f"{kib / 1024 / 1024:.0f} GiB"
    except (OSError, ValueError, IndexError):
        return "unknown"


def run_stamp() -> str:
    """Now, as a table's ``run:`` line gives it (UTC, to the minute)."""
    return f"{datetime.now(timezone.utc):%Y-%m-%d %H:%M UTC}"


def describe(packages: list[str], *, run: str | None = None) -> str:
    """
    A markdown block: date, CPU, cores, memory, OS, Python, and the given package versions.

    ``run``: the run the table's cells come from (default: now); a table updated by a later
    run keeps the first run's date, and its re-measured rows name theirs.
    """
    versions = []
    for name in packages:
        try:
            versions.append(f"{name} {version(name)}")
        except PackageNotFoundError:
            versions.append(f"{name} (not installed)")
    return "\n".join(
        [
            f"- run: {run or run_stamp()}",
            f"- machine: {_cpu_model()}, {os.cpu_count()} cores, {_memory_gib()} RAM, {platform.platform()}",
            f"- load average at the end: {' / '.join(f'{x:.1f}' for x in os.getloadavg())} (1/5/15 min)",
            f"- Python {platform.python_version()}; " + ", ".join(versions),
        ]
    )


@dataclass(frozen=True)
class Settled:
    """How long :func:`wait_until_idle` waited, and how busy the processes were at the end."""

    seconds: float
    busy: float
    """Share of one core the processes used in the last window."""
    idle: bool
    """False: still busy when the time limit came."""


async def wait_until_idle(
    pids: Sequence[int], *, busy_below: float = 0.1, window: float = 0.25, limit: float = 60.0
) -> Settled:
    """
    Wait until the processes ``pids`` (with their children) use less than ``busy_below`` of one
    core over ``window`` seconds, or ``limit`` seconds have passed.

    Why: a benchmark cell must not pay for the one before it. A broker goes on working after
    its clients have gone: moto served the abandoned long-poll receives of the 1,000 pollers of
    a per-watcher cell for another 30 s (each waiting thread wakes to look at the queue); a JVM
    collects what a cell left behind. Started at once, the next cell measured that work against
    whichever variant came next.
    """
    started = time.monotonic()
    previous = processes_cpu_seconds(pids)
    while True:
        await asyncio.sleep(window)
        now = processes_cpu_seconds(pids)
        busy = (now - previous) / window
        previous = now
        waited = time.monotonic() - started
        if busy < busy_below:
            return Settled(waited, busy, idle=True)
        if waited >= limit:
            return Settled(waited, busy, idle=False)


def process_tree(pids: Sequence[int]) -> Iterator[Any]:
    """``psutil.Process`` of ``pids`` and their living children (a JVM under a launcher)."""
    import psutil

    for pid in pids:
        try:
            root = psutil.Process(pid)
            yield from [root, *root.children(recursive=True)]
        except psutil.NoSuchProcess:
            continue


def processes_cpu_seconds(pids: Sequence[int]) -> float:
    """User and system CPU seconds of ``pids`` and their living children."""
    import psutil

    total = 0.0
    for process in process_tree(pids):
        try:
            times = process.cpu_times()
        except psutil.NoSuchProcess:
            continue
        total += times.user + times.system
    return total


def pin_threads(pids: Sequence[int], cpus: set[int]) -> None:
    """
    Restrict every thread of ``pids`` and their children to ``cpus``.

    Per thread, because an affinity set on a process binds only its main thread; threads started
    later inherit their creator's, so pinning a JVM's running threads pins those it starts next.
    """
    import psutil

    for process in process_tree(pids):
        try:
            threads = process.threads()
        except psutil.NoSuchProcess:
            continue  # the process ended meanwhile
        for thread in threads:
            try:
                os.sched_setaffinity(thread.id, cpus)
            except ProcessLookupError:
                continue  # the thread ended meanwhile
