"""
A gate for the triggerer supervisor's Execution API warm-up (issue 50): a module finder, put on
the triggerer's ``PYTHONPATH`` as ``sitecustomize``, that holds the API loop thread's first
``anyio`` import of the warm-up's one request (``InProcessExecutionAPI-loop``) until the test
releases it. ``entered`` in the gate folder says the request has begun (the supervisor's main
thread waits for it, in the fork hook: the trigger runner is not forked yet); ``release`` lets it
go on. Events, not timings.
"""

from __future__ import annotations

import os
import textwrap
from pathlib import Path

from tests.support.airflow import REPO

GATE = textwrap.dedent(
    """
    import os, sys, threading, time
    _gate = os.environ.get("WARMUP_GATE_DIR")
    class _WarmupGate:
        # Holds the API loop thread's first anyio import of the warm-up until the test releases it.
        def find_spec(self, name, path=None, target=None):
            loop_thread = threading.current_thread().name == "InProcessExecutionAPI-loop"
            if not name.startswith("anyio") or not loop_thread:
                return None
            entered = os.path.join(_gate, "entered")
            if os.path.exists(entered):
                return None
            open(entered, "w").close()
            while not os.path.exists(os.path.join(_gate, "release")):
                time.sleep(0.05)
            return None
    if _gate:
        sys.meta_path.insert(0, _WarmupGate())
    """
)


def gated_environment(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    """The gate's folder and the environment a deployment's triggerer needs for it."""
    gate, site = tmp_path / "gate", tmp_path / "site"
    for folder in (gate, site):
        folder.mkdir()
    (site / "sitecustomize.py").write_text(GATE)
    return gate, {"WARMUP_GATE_DIR": str(gate), "PYTHONPATH": f"{site}{os.pathsep}{REPO}"}
