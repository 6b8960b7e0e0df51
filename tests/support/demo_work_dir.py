"""
What ``scripts/demo.py`` does with its work directory when it ends: removed after a run that
succeeded, kept with every log after one that failed or was interrupted.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

LOGS_LISTED = 30
"""Log files named one per line when a failed run keeps its work directory (the rest counted)."""


def clean_up_or_keep(work: Path, *, succeeded: bool, temporary: bool, say: Callable[[str], None]) -> None:
    """
    Remove the demo's own temporary directory after a run that succeeded; keep it otherwise.

    A failed or interrupted run is the one whose logs (Airflow's components and tasks, Spark's
    master, worker and drivers, the broker's) say why, so they stay and the paths are printed.
    """
    if succeeded:
        if temporary:
            shutil.rmtree(work, ignore_errors=True)
        return
    logs = sorted(p.relative_to(work) for p in work.rglob("*") if p.is_file() and is_log(p))
    say(f"the work directory is kept, with every log of this run: {work}")
    for path in logs[:LOGS_LISTED]:
        print(f"    {work / path}", flush=True)
    if len(logs) > LOGS_LISTED:
        print(f"    ... and {len(logs) - LOGS_LISTED} more logs under {work}", flush=True)


def is_log(path: Path) -> bool:
    """Airflow's and the brokers' ``*.log`` files, and Spark drivers' ``stdout`` and ``stderr``."""
    return path.suffix == ".log" or path.name in ("stdout", "stderr")
