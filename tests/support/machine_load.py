"""
A loaded machine on demand (issue 50), for the demo (``--busy``) and the start-up benchmark.

A stream must start in a second and never stall its triggerer on a busy machine too: these
processes make the machine busy, and the helpers read what the triggerer said about it.
"""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

DEADLOCKED = re.compile(r"event loop appears deadlocked")
"""What the triggerer's supervisor logs when its runner stopped answering (Airflow 3.3)."""


@contextlib.contextmanager
def busy_processes(count: int) -> Iterator[list[subprocess.Popen[bytes]]]:
    """
    ``count`` processes spinning a core each, stopped when the block ends however it ends.

    Each runs in a session of its own, so a Ctrl-C at the terminal reaches only the caller, which
    stops them on its way out; a spinner that failed to start stops the ones already started.
    """
    spinners: list[subprocess.Popen[bytes]] = []
    try:
        for _ in range(count):
            spinners.append(
                subprocess.Popen([sys.executable, "-c", "while True: pass"], start_new_session=True)
            )
        yield spinners
    finally:
        for spinner in spinners:
            spinner.kill()
        for spinner in spinners:
            spinner.wait()


def load_average() -> str:
    """The machine's 1, 5 and 15 minute load averages, as ``uptime`` shows them."""
    return " / ".join(f"{value:.1f}" for value in os.getloadavg())


def deadlocked_lines(triggerer_log: Path) -> list[str]:
    """The triggerer supervisor's lines calling its runner deadlocked (a stalled event loop)."""
    try:
        text = triggerer_log.read_text(errors="replace")
    except OSError:
        return []
    return [line for line in text.splitlines() if DEADLOCKED.search(line)]
