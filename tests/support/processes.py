"""Start and stop the real servers the integration and e2e suites talk to."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path

from tests.support.ports import port_ownership


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now (never a broker's default port)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_for_port(
    port: int,
    timeout: float,
    proc: subprocess.Popen | None = None,
    what: str = "",
    *,
    owner: int | None = None,
) -> None:
    """
    Wait until OUR server accepts connections on 127.0.0.1:port; fail loudly otherwise.

    ``owner`` is the PID whose process (or descendants) must hold the listener: ``proc``'s by
    default, ``os.getpid()`` for a server on a thread of this process. A port someone else serves
    too (``free_port()`` raced with another process: another worker's broker, or a listener
    sharing it through ``SO_REUSEPORT``) raises :class:`~tests.support.ports.PortNotOursError`
    at once, instead of returning because THEIR server answered.
    """
    owner = owner if owner is not None else (proc.pid if proc is not None else None)
    name = what or "process"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"{name} exited with {proc.returncode} before listening on {port}")
        ownership = port_ownership(port, owner) if owner is not None else None
        if ownership is not None and ownership.foreign:
            ownership.check(name)
        if ownership is None or ownership.ours:
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=0.5):
                if owner is not None:  # and nobody else's took it meanwhile
                    port_ownership(port, owner).check(name)
                return
        time.sleep(0.05)
    raise RuntimeError(f"{name} did not listen on 127.0.0.1:{port} within {timeout}s")


def wait_until(condition: Callable[[], bool], timeout: float, what: str, interval: float = 0.1) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(interval)
    raise RuntimeError(f"timed out after {timeout}s waiting for {what}")


@contextlib.contextmanager
def running(
    argv: Sequence[str],
    *,
    log_path: Path,
    env: dict[str, str] | None = None,
    cwd: Path | None = None,
) -> Iterator[subprocess.Popen]:
    """
    Run a server process for the duration of the block and stop it by PID (then its group).

    Output goes to ``log_path`` so a failed start can be diagnosed from the test report.
    """
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab") as log_file:
        proc = subprocess.Popen(
            list(argv),
            stdout=log_file,
            stderr=subprocess.STDOUT,
            env={**os.environ, **(env or {})},
            cwd=cwd,
            start_new_session=True,
        )
        try:
            yield proc
        finally:
            stop(proc)


def stop(proc: subprocess.Popen, grace: float = 10.0) -> None:
    """SIGTERM the process group, then SIGKILL what is left after ``grace`` seconds."""
    stop_all([proc], grace)


def stop_all(procs: Sequence[subprocess.Popen], grace: float = 10.0) -> None:
    """
    SIGTERM the process groups of ``procs`` at once, then SIGKILL what is left after ``grace``.

    Their graceful shutdowns overlap: stopping several servers costs the slowest one's grace,
    not the sum of them.
    """
    alive = [proc for proc in procs if proc.poll() is None]
    for proc in alive:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    for proc in alive:
        try:
            proc.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(5)


def tail(path: Path, lines: int = 40) -> str:
    with contextlib.suppress(OSError):
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    return ""


STOPPED_STATES = frozenset("TtZX")
"""``/proc/<pid>/task/<tid>/stat`` states of a thread that runs no more code: stopped, traced,
dead."""


def running_threads(pids: Iterable[int]) -> list[str]:
    """The threads of ``pids`` that are not stopped (``pid/tid state``); an exited process has none."""
    running: list[str] = []
    for pid in pids:
        with contextlib.suppress(OSError):
            for task in Path(f"/proc/{pid}/task").iterdir():
                with contextlib.suppress(OSError, IndexError):
                    state = (task / "stat").read_text().rsplit(")", 1)[1].split()[0]
                    if state not in STOPPED_STATES:
                        running.append(f"{pid}/{task.name} {state}")
    return running


def wait_until_stopped(pids: Iterable[int], timeout: float = 30.0, what: str = "process") -> None:
    """
    Wait until every thread of ``pids`` is stopped: SIGSTOP is not synchronous.

    ``kill()`` returns once the signal is queued. For a multi-threaded process (a JVM) the kernel
    wakes ONE thread to take the signal and start the group stop; until that thread gets a CPU,
    the others run on, and on a loaded machine a JVM answered an ``Acknowledge`` sent right after
    its SIGSTOP (tests/integration/pubsub/test_pubsub_outage.py failed so in CI). An outage
    begins when this returns, not when the signal was sent.
    """
    members = list(pids)
    deadline = time.monotonic() + timeout
    while running := running_threads(members):
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what} was not stopped {timeout}s after SIGSTOP: {', '.join(running[:5])}")
        time.sleep(0.001)
