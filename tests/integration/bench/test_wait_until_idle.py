"""
``bench.machine.wait_until_idle``: the benchmark's wait, before each cell, for the broker to go
quiet, on real processes that burn CPU (the broker's place is taken by a Python child).
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time

import pytest

from bench.machine import wait_until_idle

pytestmark = pytest.mark.integration

BURN = (
    "import time\nprint('burning', flush=True)\nend = time.monotonic() + {seconds}\n"
    "while time.monotonic() < end: pass\ntime.sleep(60)"
)

BUSY_BELOW = 0.02
"""Lower than the default threshold: on a 2-core machine at load 16 a spinning process still gets
about an eighth of a core, and the tests must tell it from an idle one under such load too."""


def burner(seconds: float) -> subprocess.Popen:
    """A process that spins for ``seconds``, then sleeps; returned once it has started spinning."""
    process = subprocess.Popen([sys.executable, "-c", BURN.format(seconds=seconds)], stdout=subprocess.PIPE)
    started_burning(process)
    return process


def started_burning(process: subprocess.Popen) -> None:
    """Wait for the spinning code's own word, not for the interpreter's start-up, however slow."""
    assert process.stdout is not None
    assert process.stdout.readline().strip() == b"burning"


@pytest.mark.timeout(60)
def test_it_waits_while_the_process_is_busy_and_returns_once_it_is_quiet():
    started = time.monotonic()
    process = burner(2.0)
    try:
        settled = asyncio.run(wait_until_idle([process.pid], busy_below=BUSY_BELOW, limit=30))
        assert settled.idle, settled
        assert settled.busy < BUSY_BELOW, settled
        assert time.monotonic() - started >= 2.0, settled  # it burned for 2 s from its start
        assert settled.seconds < 15, settled
    finally:
        process.kill()
        process.wait()


@pytest.mark.timeout(60)
def test_a_child_that_stays_busy_is_counted_and_reported_after_the_limit():
    # The burning process is a child of the pid given, as the JVM under the emulator's launcher.
    burn = BURN.format(seconds=30)
    run_burner = f"import subprocess, sys; subprocess.run([sys.executable, '-c', {burn!r}])"
    launcher = subprocess.Popen([sys.executable, "-c", run_burner], stdout=subprocess.PIPE)
    try:
        started_burning(launcher)  # the grandchild writes to the launcher's stdout
        settled = asyncio.run(wait_until_idle([launcher.pid], busy_below=BUSY_BELOW, limit=1.5))
        assert not settled.idle, settled
        assert settled.busy > BUSY_BELOW, settled
        assert 1.5 <= settled.seconds < 5, settled
    finally:
        import psutil

        for child in psutil.Process(launcher.pid).children(recursive=True):
            child.kill()
        launcher.kill()
        launcher.wait()


@pytest.mark.timeout(30)
def test_a_process_that_has_gone_counts_as_quiet():
    process = burner(0)
    process.kill()
    process.wait()
    settled = asyncio.run(wait_until_idle([process.pid], limit=5))
    assert settled.idle, settled
    assert settled.seconds < 1, settled
