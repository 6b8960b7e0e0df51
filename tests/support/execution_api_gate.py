"""
A gate for the triggerer supervisor's Execution API warm-up (issue 50): a module finder, put on
the triggerer's ``PYTHONPATH`` as ``sitecustomize``, that holds the API loop thread's first
``anyio`` import of the warm-up's one request (``InProcessExecutionAPI-loop``) until the test
releases it. ``entered`` in the gate folder says the request has begun (the supervisor's main
thread waits for it, in the fork hook: the trigger runner is not forked yet); ``release`` lets it
go on. Events, not timings.

The default gate holds the request inside the finder, that is under CPython's global import lock,
which ``os.fork`` takes too: a fork waits for the release. ``in_module=True`` holds it in the
module's own execution instead (under that module's lock only), as a real request importing at
the fork would be: the fork goes on while it is held.
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
            if os.environ.get("WARMUP_GATE_IN_MODULE"):
                return self._held_in_module(name, path, target, entered)
            open(entered, "w").close()
            self._wait()
            return None
        def _wait(self):
            while not os.path.exists(os.path.join(_gate, "release")):
                time.sleep(0.05)
        def _held_in_module(self, name, path, target, entered):
            from importlib.machinery import PathFinder
            spec = PathFinder.find_spec(name, path, target)
            if spec is None or spec.loader is None:
                return spec
            real = spec.loader.exec_module
            def exec_module(module):
                if os.environ.get("WARMUP_GATE_SLOW_START"):
                    _slow_start_after_the_fork()
                open(entered, "w").close()
                self._wait()
                return real(module)
            spec.loader.exec_module = exec_module
            return spec
    def _slow_start_after_the_fork():
        # Keep the supervisor's main thread in TriggerRunnerSupervisor.start after the fork (its
        # first message to the runner) until the provider's stop-signal thread, if one was started,
        # has sent what it kept, or has gone round its waiting loop WAITS_SEEN times meanwhile (the
        # fixed code waits for start to return; code that does not sends at its next round).
        runner = sys.modules["airflow.jobs.triggerer_job_runner"].TriggerRunnerSupervisor
        send_msg = runner.send_msg
        rounds = [0]
        sleep = time.sleep
        def counted_sleep(seconds):
            if threading.current_thread().name == "shared-stream-stop-signal":
                rounds[0] += 1
            return sleep(seconds)
        time.sleep = counted_sleep
        def signal_thread_alive():
            return any(t.name == "shared-stream-stop-signal" for t in threading.enumerate())
        def slow_send_msg(self, msg, *args, **kwargs):
            if type(msg).__name__ == "StartTriggerer":
                seen = rounds[0]
                while signal_thread_alive() and rounds[0] - seen < 5:
                    sleep(0.01)
            return send_msg(self, msg, *args, **kwargs)
        runner.send_msg = slow_send_msg
    if _gate:
        sys.meta_path.insert(0, _WarmupGate())
    """
)


def gated_environment(
    tmp_path: Path, in_module: bool = False, slow_start: bool = False
) -> tuple[Path, dict[str, str]]:
    """
    The gate's folder and the environment a deployment's triggerer needs for it; ``slow_start``
    (with ``in_module``) keeps the supervisor in ``TriggerRunnerSupervisor.start`` after the fork
    until the provider's stop-signal thread has sent what it kept.
    """
    gate, site = tmp_path / "gate", tmp_path / "site"
    for folder in (gate, site):
        folder.mkdir()
    (site / "sitecustomize.py").write_text(GATE)
    env = {"WARMUP_GATE_DIR": str(gate), "PYTHONPATH": f"{site}{os.pathsep}{REPO}"}
    if in_module:
        env["WARMUP_GATE_IN_MODULE"] = "1"
    if slow_start:
        env["WARMUP_GATE_SLOW_START"] = "1"
    return gate, env
