"""The parent-death launcher: its Python child dies when the parent (the driver JVM) dies."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

LAUNCHER = Path(sys.executable).parent / "airflow-shared-stream-driver-python"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    stat = Path(f"/proc/{pid}/stat")
    return stat.exists() and stat.read_text().split(") ", 1)[1][0] != "Z"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux-only")
@pytest.mark.parametrize("use_launcher", [True, False])
def test_child_python_dies_with_its_parent(tmp_path, use_launcher):
    assert LAUNCHER.exists(), "console script missing: run scripts/bootstrap.sh"
    pid_file = tmp_path / "child.pid"
    child = [str(LAUNCHER)] if use_launcher else [sys.executable]
    child += ["-c", f"import os,time; open({str(pid_file)!r},'w').write(str(os.getpid())); time.sleep(60)"]
    # The "JVM": a parent that starts the child and waits on it, as PythonRunner does.
    parent = subprocess.Popen(
        [sys.executable, "-c", f"import subprocess; subprocess.run({child!r})"], start_new_session=True
    )
    try:
        deadline = time.monotonic() + 20
        while not pid_file.exists() or not pid_file.read_text():
            assert time.monotonic() < deadline, "child never started"
            time.sleep(0.05)
        pid = int(pid_file.read_text())
        assert _alive(pid)
        os.kill(parent.pid, signal.SIGKILL)
        parent.wait(5)
        deadline = time.monotonic() + 5
        while _alive(pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        # With the launcher the child is gone; without it, it is orphaned and keeps running.
        assert _alive(pid) is not use_launcher
    finally:
        if pid_file.exists() and pid_file.read_text():
            pid = int(pid_file.read_text())
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)


def test_launcher_execs_the_requested_interpreter(tmp_path):
    out = subprocess.run(
        [str(LAUNCHER), "-c", "import sys; print(sys.executable)"],
        env={**os.environ, "SPARK_PDEATHSIG_PYTHON": sys.executable},
        capture_output=True,
        text=True,
        check=True,
        timeout=30,
    )
    assert out.stdout.strip() == sys.executable
