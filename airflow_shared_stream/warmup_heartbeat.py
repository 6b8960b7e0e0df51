"""
The triggerer job's heartbeat while its supervisor warms up before forking its trigger runner.

The warm-up (:mod:`.runner_fork`: the streams' imports, then :mod:`.execution_api_warmup`) runs
on the supervisor's main thread before Airflow's supervisor loop, which sends the job's
heartbeats, has started: 3.5-5 s idle, about 30 s on a loaded 2-core machine, past
``[triggerer] triggerer_health_check_threshold``: the triggerer looked dead to health checks and
to other triggerers meanwhile (docs/benchmarks.rst). So the warm-up beats as that loop does,
through Airflow's own ``perform_heartbeat`` (only when one is due): between its steps, and while
the main thread waits for the API's first request, which runs in a short-lived thread for that.

That thread is joined before the fork hook returns: a thread alive at the fork can leave the
runner a lock it held. A stop signal while the main thread waits for it (``runner_fork``'s
``_StopRequested``) waits on for the request, beating, then the fork and the stop go on; a
second stop signal ends that wait too (a second signal forces Airflow's triggerer out as well).
While the thread starts, stop signals are held back (a stop raised inside ``Thread.start`` could
not tell whether the thread exists) and handled as soon as it has started.

A beat never hurts the warm-up: a failure is logged at info. Its callback does nothing (the
supervisor's sends a metric), and a failed beat's metric goes nowhere rather than build
Airflow's stats backend before the fork (see :mod:`.runner_fork` for why it must not).
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

log = logging.getLogger(__name__)

T = TypeVar("T")

LONGEST_WAIT = 1.0
"""Seconds the main thread waits for the request between two heartbeat checks, or the job's
heartrate if shorter (Airflow's supervisor loop waits up to 1 s for its runner between them)."""

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)
"""Held back while the request's thread starts, and handled as they would have been once it has."""

_job: Any = None


def beat_for(job: Any) -> None:
    """Beat for ``job`` (the supervisor's triggerer job) from now on; ``None`` ends the beating."""
    global _job
    _job = job


def beat() -> None:
    """Send the job's heartbeat if one is due; never raises an ``Exception``."""
    job = _job
    if job is None or threading.current_thread() is not threading.main_thread():
        return  # the job's session is the main thread's (Airflow beats from there too)
    if not callable(getattr(job, "heartbeat", None)):
        return
    try:
        from airflow.jobs.job import perform_heartbeat

        with _no_stats_backend_built():
            perform_heartbeat(job, heartbeat_callback=_no_callback, only_if_necessary=True)
    except Exception as exc:  # a database error, a job marked for restart: the supervisor loop's to handle
        log.info("No triggerer heartbeat during the warm-up before the fork (%s)", type(exc).__name__)


def _no_callback(session: Any = None) -> None:
    return None


@contextlib.contextmanager
def _no_stats_backend_built() -> Iterator[None]:
    # Airflow's Job.heartbeat sends a metric when the database fails it, which would build the
    # stats backend now, before the fork: while beating, an unbuilt backend is a NoStatsLogger.
    stats = getattr(sys.modules.get("airflow.jobs.job"), "stats", None)
    placeholder_type = getattr(stats, "NoStatsLogger", None)
    if placeholder_type is None or getattr(stats, "_backend", True) is not None:
        yield
        return
    placeholder = placeholder_type()
    stats._backend = placeholder  # type: ignore[union-attr]
    try:
        yield
    finally:
        if stats._backend is placeholder:  # type: ignore[union-attr]
            stats._backend = None  # type: ignore[union-attr]


def call_beating(work: Callable[[], T], name: str) -> T:
    """``work()`` in a short-lived thread ``name`` while the calling thread beats; joined on return."""
    outcome: list[tuple[bool, Any]] = []
    finished = threading.Event()

    def run() -> None:
        try:
            outcome.append((True, work()))
        except BaseException as exc:
            outcome.append((False, exc))
        finally:
            finished.set()

    worker = threading.Thread(target=run, name=name, daemon=True)
    with _stop_signals_held_back() as held:
        worker.start()  # a stop raised in here could not tell whether the thread exists
    try:
        _raise_held(held)
        _wait_beating(finished)
    finally:
        # A stop signal ended the wait: the request still runs, and the runner must not be forked
        # beside it. A second stop signal ends this wait as well.
        _wait_beating(finished)
        # Only now: a signal handler's exception inside Thread.join (Python 3.11) marks a thread
        # that still runs as stopped.
        worker.join()
    done, value = outcome[0]
    if not done:
        raise value
    return value


@contextlib.contextmanager
def _stop_signals_held_back() -> Iterator[list[int]]:
    held: list[int] = []
    if threading.current_thread() is not threading.main_thread():
        yield held
        return
    previous = {
        signum: signal.signal(signum, lambda signum, frame: held.append(signum))
        for signum in STOP_SIGNALS
        if signal.getsignal(signum) is not None  # None: not Python's to put back
    }
    try:
        yield held
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def _raise_held(held: list[int]) -> None:
    for signum in held:
        handler = signal.getsignal(signum)
        if callable(handler):
            handler(signum, None)
        else:
            os.kill(os.getpid(), signum)


def _wait_beating(finished: threading.Event) -> None:
    wait = LONGEST_WAIT
    with contextlib.suppress(Exception):
        if _job is not None and float(_job.heartrate) > 0:
            wait = min(wait, float(_job.heartrate))
    while not finished.wait(wait):
        beat()
