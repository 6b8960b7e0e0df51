"""
Ready the triggerer supervisor's in-process Execution API in a thread before anything needs it.

A triggerer's supervisor serves a trigger's asset state store writes (this provider's stream
figures), connection and variable reads, through an in-process Execution API, built when the
first such request comes and served on the supervisor's main thread. Two costs hide there: the
app (imports, FastAPI routes) and, at its first request, Cadwyn's versioned routers, generated
per app instance. On a loaded machine each took tens of seconds (docs/benchmarks.rst), during
which the supervisor answered no request of the trigger runner and sent no heartbeat; it then
logged the runner "deadlocked" and let its triggers be reassigned.

So a thread of the supervisor builds one instance and sends it one request (which generates the
routers), and Airflow's ``in_process_api_server`` returns that instance: the supervisor's
client, made at its first request, uses it ready, or waits for it if the warm-up is still at it
(one build, not two at once). Airflow 3.3.2 offers no other way in
(``TriggerRunnerSupervisor.make_client`` is meant for subclasses, and Airflow makes the
supervisor itself). If the supervisor made its client before the warm-up began, nothing
changes: it built its own as before.

The warm-up imports nothing before the supervisor has forked its trigger runner (a bare
``os.fork``, right after the job starts; :mod:`.runner_fork` tells when): a module a thread is
importing at a fork stays locked in the child by a thread the child does not have, and the API's
461 modules include aiohttp (which the SQS stream's SDK imports in the runner) and
cryptography's (Pub/Sub's): a trigger importing one there would wait forever.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

log = logging.getLogger(__name__)

READY_WAIT_SECONDS = 120.0
"""Longest the supervisor's first request waits for the warm-up before building its own."""
IN_PROCESS_BASE_URL = "http://in-process.invalid./"
"""Where Airflow's supervisor client points its in-process transport (any host: nothing resolves it)."""


def triggerer_job_id(
    job: Any,
    stopped: threading.Event,
    timeout: float = 300.0,
    forked: threading.Event | None = None,
    waiting: threading.Event | None = None,
) -> int | None:
    """
    The listener fires before the job has a type or an id: wait for both; ``None`` if the job is
    not a triggerer's. Read from the instance's ``__dict__``: an ORM attribute read from this
    thread must never lazy-load through the session the job's own thread is using. With
    ``forked``, wait for it too: a supervisor thread that imports while the trigger runner is
    forked can leave the runner a module lock held for good (:mod:`.runner_fork`); ``waiting``
    is set meanwhile.
    """
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and not stopped.is_set():
        state = vars(job)
        job_type = state.get("job_type")
        if job_type is not None and job_type != "TriggererJob":
            return None
        job_id = state.get("id")
        if job_type == "TriggererJob" and job_id is not None:
            if forked is None or forked.is_set():
                if waiting is not None:
                    waiting.clear()
                return int(job_id)
            if waiting is not None:
                waiting.set()
            forked.wait(min(0.5, max(0.0, deadline - time.monotonic())))
            continue
        stopped.wait(0.5)
    return None


def ready_in_process_api() -> Any:
    """An ``InProcessExecutionAPI`` whose app is built and has answered one request."""
    import httpx
    from airflow.api_fastapi.execution_api.app import InProcessExecutionAPI

    api = InProcessExecutionAPI()
    with httpx.Client(transport=api.transport, base_url=IN_PROCESS_BASE_URL) as client:
        client.get("/health")  # whatever it answers, Cadwyn generated its routers for it
    return api


class ExecutionApiWarmup(threading.Thread):
    """Ready the in-process Execution API for this triggerer's supervisor (module docstring)."""

    def __init__(self, job: Any, forked: threading.Event | None = None) -> None:
        super().__init__(name="shared-stream-execution-api-warmup", daemon=True)
        self.job = job
        self.forked = forked
        """Set once the trigger runner is forked: nothing is imported before (:mod:`.runner_fork`)."""
        self.stopped = threading.Event()
        self.ready = threading.Event()
        """Set when the warm-up ended, with :attr:`api` ready or ``None`` (it failed)."""
        self.api: Any = None
        self.waiting_for_fork = threading.Event()
        """Set while the warm-up waits for the supervisor to fork its trigger runner."""

    def run(self) -> None:
        if (
            triggerer_job_id(self.job, self.stopped, forked=self.forked, waiting=self.waiting_for_fork)
            is None
        ):
            return
        started = time.monotonic()
        from airflow.jobs import triggerer_job_runner

        own_build = triggerer_job_runner.in_process_api_server

        def warmed_or_own() -> Any:
            # A first request while the warm-up runs waits for it rather than building a second
            # instance beside it (both would take longer); the warm-up gets the CPU meanwhile.
            self.ready.wait(READY_WAIT_SECONDS)
            return self.api if self.api is not None else own_build()

        triggerer_job_runner.in_process_api_server = warmed_or_own
        try:
            self.api = ready_in_process_api()
        except Exception as exc:  # never let the warm-up hurt the triggerer
            log.info(
                "Could not warm the in-process Execution API up (%s); the first request builds it",
                type(exc).__name__,
            )
            return
        finally:
            self.ready.set()
        log.info(
            "Warmed the in-process Execution API up for the streams' figures (%d routes) in %.1f s",
            len(self.api.app.routes),
            time.monotonic() - started,
        )
