"""Describe the machine and package versions a benchmark ran on, for its results file."""

from __future__ import annotations

import os
import platform
from datetime import datetime, timezone
from importlib.metadata import PackageNotFoundError, version


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


def describe(packages: list[str]) -> str:
    """A markdown block: date, CPU, cores, memory, OS, Python, and the given package versions."""
    versions = []
    for name in packages:
        try:
            versions.append(f"{name} {version(name)}")
        except PackageNotFoundError:
            versions.append(f"{name} (not installed)")
    return "\n".join(
        [
            f"- run: {datetime.now(timezone.utc):%Y-%m-%d %H:%M UTC}",
            f"- machine: {_cpu_model()}, {os.cpu_count()} cores, {_memory_gib()} RAM, {platform.platform()}",
            f"- load average at the end: {' / '.join(f'{x:.1f}' for x in os.getloadavg())} (1/5/15 min)",
            f"- Python {platform.python_version()}; " + ", ".join(versions),
        ]
    )
