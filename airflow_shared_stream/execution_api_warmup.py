"""
Ready the triggerer supervisor's in-process Execution API before its trigger runner exists.

A triggerer's supervisor serves a trigger's asset state store writes (this provider's stream
figures, Kafka's topic-id memory), connection and variable reads, through an in-process
Execution API, built when the first such request comes and served on the supervisor's main
thread. Two costs hide there: the app (imports, FastAPI routes) and, at its first request,
Cadwyn's versioned routers, generated per app instance. On a loaded machine they took tens of
seconds, during which the supervisor answered no request of the trigger runner and sent no
heartbeat; it then logged the runner "deadlocked" and let its triggers be reassigned.

So the supervisor builds one instance and sends it one request (which generates the routers) on
its main thread just before it forks its trigger runner (:mod:`.runner_fork` calls
:func:`warm_up_before_fork`), and Airflow's ``in_process_api_server`` returns that instance:
the supervisor's client, made at its first request, finds it ready. Airflow 3.3.2 offers no
other way in (``TriggerRunnerSupervisor.make_client`` is meant for subclasses, and Airflow makes
the supervisor itself). Before the fork, nothing else runs in the supervisor, no runner waits
for it and its watchdog has not started. A thread doing it after the fork (how it was done
first) ran beside the supervisor's main thread for a minute on a loaded machine: each database
round trip of the main thread waited for that CPU-bound thread to give the interpreter back
(asset events persisted at 3-4 per second instead of 17-21), and a state store write that came
before it ended waited for it, both past the watchdog (docs/benchmarks.rst). If the warm-up
fails, the supervisor builds its own at its first request, as Airflow does.

The instance's event loop thread (Airflow's, ``InProcessExecutionAPI-loop``) is idle when the
process forks: the one request has been answered. The runner does not have it and never needs
it (it talks to the supervisor, not to the API). The request is sent from a short-lived thread,
joined before the fork, so that the main thread sends the job's heartbeats while it waits.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from airflow_shared_stream.warmup_heartbeat import beat, call_beating

log = logging.getLogger(__name__)

IN_PROCESS_BASE_URL = "http://in-process.invalid./"
"""Where Airflow's supervisor client points its in-process transport (any host: nothing resolves it)."""


def triggerer_job_id(
    job: Any,
    stopped: threading.Event,
    timeout: float = 300.0,
    forked: threading.Event | None = None,
) -> int | None:
    """
    The listener fires before the job has a type or an id: wait for both; ``None`` if the job is
    not a triggerer's. Read from the instance's ``__dict__``: an ORM attribute read from this
    thread must never lazy-load through the session the job's own thread is using. With
    ``forked``, wait for it too: a supervisor thread that imports while the trigger runner is
    forked can leave the runner a module lock held for good (:mod:`.runner_fork`).
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
                return int(job_id)
            forked.wait(min(0.5, max(0.0, deadline - time.monotonic())))
            continue
        stopped.wait(0.5)
    return None


def ready_in_process_api() -> Any:
    """
    An ``InProcessExecutionAPI`` whose app is built and has answered one request.

    The job's heartbeat goes on between the steps and during the request (:mod:`.warmup_heartbeat`).
    """
    import httpx
    from airflow.api_fastapi.execution_api.app import InProcessExecutionAPI

    beat()
    api = InProcessExecutionAPI()
    api.app  # noqa: B018 - builds the app (its routes) on this thread
    beat()
    transport = api.transport  # starts the API's loop thread and its lifespan
    beat()

    def first_request() -> None:
        with httpx.Client(transport=transport, base_url=IN_PROCESS_BASE_URL) as client:
            client.get("/health")  # whatever it answers, Cadwyn generated its routers for it

    call_beating(first_request, name="shared-stream-execution-api-first-request")
    return api


def warm_up_before_fork() -> Any:
    """
    Build the supervisor's Execution API and hand it to Airflow; the instance, or ``None``.

    Called on the supervisor's main thread just before it forks its trigger runner. A failure
    is logged and left to the supervisor's first request, which then builds its own.
    """
    started = time.monotonic()
    try:
        from airflow.jobs import triggerer_job_runner

        api = ready_in_process_api()
    except Exception as exc:  # never let the warm-up hurt the triggerer
        log.info(
            "Could not warm the in-process Execution API up (%s); the first request builds it",
            type(exc).__name__,
        )
        return None
    triggerer_job_runner.in_process_api_server = lambda: api
    log.info(
        "Warmed the in-process Execution API up before the trigger runner starts (%d routes) in %.1f s",
        len(api.app.routes),
        time.monotonic() - started,
    )
    return api
