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
import gc, json, os, sys
from types import SimpleNamespace
from airflow_shared_stream import runner_fork
from airflow_shared_stream.placement import PlacementListener

job = SimpleNamespace(job_type=None)  # the listener fires before the job has a type
PlacementListener().on_starting(job)
job.job_type = sys.argv[1]
job.id = 7
read, write = os.pipe()
pid = os.fork()
if pid == 0:  # the trigger runner
    names = ("aiokafka", "aiobotocore", "azure.servicebus", "google.pubsub_v1",
             "airflow_shared_stream.kafka.producer", "airflow_shared_stream.sqs.producer",
             "airflow_shared_stream.pubsub.producer", "airflow_shared_stream.servicebus.producer")
    # What the runner's collections walk: the objects of its generations, not the frozen ones.
    walked = {id(o) for o in gc.get_objects()}
    existing = ("airflow", "airflow_shared_stream.sqs.producer")
    collected = [name for name in existing if name in sys.modules and id(sys.modules[name]) in walked]
    os.write(write, json.dumps([[name for name in names if name in sys.modules], collected]).encode())
    os._exit(0)
os.waitpid(pid, 0)
runner_had, runner_collects = json.loads(os.read(read, 65536))
print(json.dumps({"runner_had": runner_had, "runner_collects": runner_collects,
                  "forked": runner_fork.runner_forked.is_set(),
                  "supervisor_frozen": gc.get_freeze_count()}))
"""


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
    assert result == {
        "runner_had": [],
        "runner_collects": ["airflow"],
        "forked": False,
        "supervisor_frozen": 0,
    }


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
