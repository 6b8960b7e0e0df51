"""
The triggerer's supervisor imports the streams' modules before it forks its runner (issue 50).

Each check runs in a fresh interpreter, as a triggerer's supervisor is one: the listener's
``on_starting`` registers the hooks for a job that becomes a triggerer's, the process forks as
``TriggerRunnerSupervisor.start`` does, and the child (the runner) reports which modules it
started with. Events, not timings: they hold on a loaded machine.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace

from airflow_shared_stream.execution_api_warmup import triggerer_job_id

REPO = Path(__file__).resolve().parents[2]

FORK_AS_THE_TRIGGERER_DOES = """
import gc, json, os, sys, threading
from types import SimpleNamespace
from airflow_shared_stream import runner_fork
from airflow_shared_stream.placement import PlacementListener

job = SimpleNamespace(job_type=None)  # the listener fires before the job has a type
PlacementListener().on_starting(job)
job.job_type = sys.argv[1]
job.id = 7
read, write = os.pipe()
pid = os.fork()
if pid == 0:  # the trigger runner: what it started with is what the supervisor had at the fork
    names = ("aiokafka", "aiobotocore", "azure.servicebus", "google.pubsub_v1",
             "airflow_shared_stream.kafka.producer", "airflow_shared_stream.sqs.producer",
             "airflow_shared_stream.pubsub.producer", "airflow_shared_stream.servicebus.producer")
    # What the runner's collections walk: the objects of its generations, not the frozen ones.
    walked = {id(o) for o in gc.get_objects()}
    existing = ("airflow", "airflow_shared_stream.sqs.producer")
    collected = [name for name in existing if name in sys.modules and id(sys.modules[name]) in walked]
    from airflow.jobs import triggerer_job_runner
    build = triggerer_job_runner.in_process_api_server  # what the supervisor's first request calls
    api = build() if build.__module__ != triggerer_job_runner.__name__ else None  # never Airflow's own
    if api is not None and id(api) in walked:
        collected.append("the Execution API")  # built before the fork, after the freeze
    os.write(write, json.dumps({
        "runner_had": [name for name in names if name in sys.modules],
        "runner_had_for_connections": [name for name in runner_fork.STREAM_START_MODULES
                                       if name in sys.modules],
        "runner_collects": collected,
        "api_ready_at_fork": bool(api is not None and api.app._cadwyn_initialized),
    }).encode())
    os._exit(0)
threads_after_fork = sorted(thread.name for thread in threading.enumerate())
os.waitpid(pid, 0)
print(json.dumps({**json.loads(os.read(read, 65536)),
                  "forked": runner_fork.runner_forked.is_set(),
                  "supervisor_frozen": gc.get_freeze_count(),
                  "threads_after_fork": threads_after_fork}))
"""

THREADS_IDLE_AFTER_THE_FORK = {
    "MainThread",
    "InProcessExecutionAPI-loop",  # Airflow's event loop of the instance, idle until a request
    "AnyIO worker thread",  # the instance's worker that answered the warm-up's request, idle
    "shared-stream-placement-monitor",  # waits on an event; one database read per interval
}
"""The supervisor's threads once its runner is forked: none of them works beside its main thread."""


def _fork_as(job_type: str) -> dict[str, object]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    out = subprocess.run(
        [sys.executable, "-c", FORK_AS_THE_TRIGGERER_DOES, job_type],
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO,
        timeout=300,
        check=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_a_triggerers_runner_starts_with_every_installed_streams_modules_imported() -> None:
    result = _fork_as("TriggererJob")
    assert set(result["runner_had"]) == {  # type: ignore[arg-type]
        "aiokafka",
        "aiobotocore",
        "azure.servicebus",
        "google.pubsub_v1",
        "airflow_shared_stream.kafka.producer",
        "airflow_shared_stream.sqs.producer",
        "airflow_shared_stream.pubsub.producer",
        "airflow_shared_stream.servicebus.producer",
    }, "the runner would import its streams' SDKs in a thread beside its event loop"
    assert result["forked"] is True


def test_a_triggerers_runner_starts_with_what_a_streams_first_connection_read_imports() -> None:
    """
    Every broker's hook reads its connection through ``BaseHook.aget_connection`` on the runner's
    loop, whose first call imported the Task SDK's ``Connection`` there (issue 50).
    """
    result = _fork_as("TriggererJob")
    assert result["runner_had_for_connections"] == [
        "airflow.sdk.definitions.connection",
        "airflow.sdk.execution_time.cache",
    ], "a stream's first connection read would import them on the runner's event loop"


def test_a_triggerers_runner_never_collects_the_objects_the_supervisor_had_at_the_fork() -> None:
    """
    The runner's first full collection, set off by a stream's first allocations, walked Airflow's
    modules and the preloaded SDKs on the loop: the 0.2-0.8 s block after a stream's start.
    """
    result = _fork_as("TriggererJob")
    assert result["runner_collects"] == [], (
        "the runner's collector walks objects the supervisor had before the fork (not frozen)"
    )
    assert result["supervisor_frozen"] == 0, "the supervisor's own collector was left frozen"


def test_another_jobs_fork_imports_nothing() -> None:
    result = _fork_as("SchedulerJob")
    assert result["runner_had"] == []
    assert result["runner_collects"] == ["airflow"]
    assert result["forked"] is False
    assert result["api_ready_at_fork"] is False
    assert result["supervisor_frozen"] == 0


def test_a_triggerers_execution_api_is_ready_before_its_runner_is_forked() -> None:
    """
    Issue 50: the supervisor's first state store write (a stream's figures, Kafka's topic-id
    memory) waited on its main thread for a warm-up thread still building the API, 30.3 s on a
    loaded machine, past Airflow's 30 s watchdog. Ready before the runner exists, it never waits.
    """
    result = _fork_as("TriggererJob")
    assert result["api_ready_at_fork"] is True, (
        "the supervisor's first request would build the API, or wait for a warm-up, on its main thread"
    )


def test_no_thread_of_the_supervisor_works_beside_its_main_thread_after_the_fork() -> None:
    """
    Issue 50: a warm-up thread that built the API after the fork ran beside the supervisor's
    main thread for a minute on a loaded machine, and each database round trip of the main
    thread waited for it to give the interpreter back: a burst's 126 asset events persisted at
    3-4 per second (17-21 without it), 43 s with no read of the runner ("deadlocked").
    """
    result = _fork_as("TriggererJob")
    assert set(result["threads_after_fork"]) <= THREADS_IDLE_AFTER_THE_FORK, result["threads_after_fork"]  # type: ignore[arg-type]


def test_supervisor_threads_start_their_work_only_after_the_runner_is_forked() -> None:
    """A thread importing while the process forks could leave the runner a module lock held for good."""
    forked, stopped = threading.Event(), threading.Event()
    job = SimpleNamespace(job_type="TriggererJob", id=3)
    got: list[int | None] = []
    waiting = threading.Thread(target=lambda: got.append(triggerer_job_id(job, stopped, 60, forked)))
    waiting.start()
    time.sleep(0.3)  # not a wait for an outcome: the thread must still be waiting after it
    assert not got, "a supervisor thread went on before the runner was forked"
    assert waiting.is_alive()
    forked.set()
    waiting.join(60)
    assert got == [3]


RUNNER_FORKS_IN_TURN = """
import gc, json, os, sys, threading
from types import SimpleNamespace
from airflow_shared_stream.placement import PlacementListener

job = SimpleNamespace(job_type=None)
PlacementListener().on_starting(job)
job.job_type = "TriggererJob"
job.id = 7
read, write = os.pipe()
pid = os.fork()  # the supervisor forks its trigger runner
if pid == 0:  # the runner forks in turn (a trigger using multiprocessing's fork context)
    before = {thread.name for thread in threading.enumerate()}
    frozen_before = gc.get_freeze_count()
    grandchild = os.fork()
    if grandchild == 0:
        os._exit(0)
    os.waitpid(grandchild, 0)
    os.write(write, json.dumps({
        "new_threads": sorted({thread.name for thread in threading.enumerate()} - before),
        "frozen_before": frozen_before,
        "frozen_after": gc.get_freeze_count(),
    }).encode())
    os._exit(0)
os.waitpid(pid, 0)
print(json.dumps(json.loads(os.read(read, 65536))))
"""


def test_a_fork_inside_the_trigger_runner_leaves_the_supervisors_hooks_out() -> None:
    """
    FAULT_MODEL 13 (load): the runner inherited the supervisor's hook state, so a fork of its
    own ran the streams' imports and built a second Execution API (two threads) on its event
    loop, then unfroze the heap it had inherited (its next full collection walks it on the loop).
    """
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    out = subprocess.run(
        [sys.executable, "-c", RUNNER_FORKS_IN_TURN],
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO,
        timeout=300,
        check=True,
    )
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["frozen_after"] == result["frozen_before"] > 0, result
    assert result["new_threads"] == [], result
