"""
The triggerer job's heartbeat during the supervisor's warm-up before the fork (issue 50 follow-up).

The guarantee itself, in a real triggerer, is tests/integration/test_runner_fork_warmup_heartbeat.py;
these check what the warm-up does around a beat: a failed one never stops it and builds no stats
backend before the fork, and the request's thread is joined even when a stop ends the wait.
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest

from airflow_shared_stream import warmup_heartbeat


@pytest.fixture
def beating_for() -> Iterator[Any]:
    yield warmup_heartbeat.beat_for
    warmup_heartbeat.beat_for(None)


class _FailingJob(SimpleNamespace):
    """Due for a beat; its heartbeat fails as Airflow's does on a database error (it sends a metric)."""

    def heartbeat(self, heartbeat_callback: Any) -> None:
        from airflow.jobs import job

        job.stats.incr("job_heartbeat_failure", 1, 1)
        raise RuntimeError("database is locked")


def test_a_failed_heartbeat_neither_stops_the_warm_up_nor_builds_the_stats_backend(
    beating_for: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from airflow.jobs import job

    monkeypatch.setattr(job.stats, "_backend", None)  # as Airflow's triggerer leaves it before the fork
    built: list[str] = []
    monkeypatch.setattr(job.stats, "_factory", lambda: built.append("backend") or job.stats.NoStatsLogger())
    logged: list[tuple[Any, ...]] = []
    monkeypatch.setattr(warmup_heartbeat, "log", SimpleNamespace(info=lambda *args: logged.append(args)))
    beating_for(_FailingJob(latest_heartbeat=None, heartrate=1.0))
    warmup_heartbeat.beat()
    assert [args[1] for args in logged] == ["RuntimeError"]
    assert built == [], "the stats backend was built before the fork"
    assert job.stats._backend is None


def test_the_requests_thread_is_joined_even_when_a_stop_ends_the_wait(beating_for: Any) -> None:
    """A thread alive at the fork can leave the runner a lock it held: a stop waits for the request."""

    class Stop(BaseException):
        pass

    release, done = threading.Event(), threading.Event()

    def stop(signum: int, frame: Any) -> None:
        release.set()  # the request can end only once the stop has ended the main thread's wait
        raise Stop

    def request() -> None:
        os.kill(os.getpid(), signal.SIGTERM)  # the stop, while the main thread waits
        release.wait(60)
        done.set()

    beating_for(SimpleNamespace(job_type="TriggererJob", heartrate=0.05))
    previous = signal.signal(signal.SIGTERM, stop)
    try:
        with pytest.raises(Stop):
            warmup_heartbeat.call_beating(request, name="test-warm-up-request")
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert done.is_set(), "the wait ended before the request did"
    assert "test-warm-up-request" not in {thread.name for thread in threading.enumerate()}


def test_the_requests_outcome_is_the_callers(beating_for: Any) -> None:
    assert warmup_heartbeat.call_beating(lambda: 42, name="test-answer") == 42
    with pytest.raises(ValueError, match="no routes"):
        warmup_heartbeat.call_beating(
            lambda: (_ for _ in ()).throw(ValueError("no routes")), name="test-fail"
        )
