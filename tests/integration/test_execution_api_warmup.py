"""
The triggerer supervisor's in-process Execution API is ready before its first request (issue 50).

A busy demo's triggerer logged its runner "deadlocked" for 48 s: the supervisor's first asset
state store write (a stream's figures) made Airflow's in-process Execution API generate Cadwyn's
versioned routers, per app instance, on the supervisor's main thread (44-49 s at load 19, for
an instance built in 2 s once another had been). The warm-up built a second instance and sent it
nothing, so the supervisor's own instance still paid at its first request.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from airflow_shared_stream.execution_api_warmup import ExecutionApiWarmup

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]


def test_the_supervisors_in_process_api_is_ready_before_its_first_request(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from airflow.jobs import triggerer_job_runner

    # Restored after the test: the warm-up replaces it for the rest of its process.
    monkeypatch.setattr(
        triggerer_job_runner, "in_process_api_server", triggerer_job_runner.in_process_api_server
    )
    job = SimpleNamespace(job_type="TriggererJob", id=1)
    warmup = ExecutionApiWarmup(job)  # no fork to wait for (the listener passes runner_forked)
    warmup.start()
    warmup.join()  # a guard, not a wait: the test's timeout bounds it

    # What TriggerRunnerSupervisor.make_client asks for, at the supervisor's first request.
    api = triggerer_job_runner.in_process_api_server()
    assert api.app._cadwyn_initialized, (
        "the supervisor's own API would generate its routers on its main thread"
    )
    assert triggerer_job_runner.in_process_api_server() is api


def test_a_job_that_is_not_a_triggerers_is_left_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    from airflow.jobs import triggerer_job_runner

    original = triggerer_job_runner.in_process_api_server
    monkeypatch.setattr(triggerer_job_runner, "in_process_api_server", original)
    warmup = ExecutionApiWarmup(SimpleNamespace(job_type="SchedulerJob", id=1))
    warmup.start()
    warmup.join()
    assert triggerer_job_runner.in_process_api_server is original


FORK_DURING_WARM_UP = r"""
import importlib.machinery, os, signal, sys, threading
from types import SimpleNamespace

SHARED = "aiohttp"  # the warm-up imports it (461 modules in all); the SQS stream's aiobotocore too
entered, release = threading.Event(), threading.Event()


class Gate:
    # Holds the warm-up thread in its import of SHARED (the module's body, under the module's own
    # lock only), as a fork can find it: a finder itself runs under the global import lock.
    def find_spec(self, name, path=None, target=None):
        if name != SHARED or threading.current_thread().name != "shared-stream-execution-api-warmup":
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        real = spec.loader

        class Held:
            def create_module(self, spec):
                return real.create_module(spec)

            def exec_module(self, module):
                entered.set()
                release.wait()
                real.exec_module(module)

        spec.loader = Held()
        return spec


import airflow.jobs.triggerer_job_runner  # what the triggerer has imported when its job starts
from airflow_shared_stream import runner_fork
from airflow_shared_stream.execution_api_warmup import ExecutionApiWarmup

assert SHARED not in sys.modules, "the triggerer imports it before its job starts"
sys.meta_path.insert(0, Gate())
job = SimpleNamespace(job_type="TriggererJob", id=1)
runner_fork.watch(job)  # as the provider's listener does when the job starts
warmup = ExecutionApiWarmup(job, forked=runner_fork.runner_forked)
warmup.start()
# The supervisor forks once its job started: here, once the warm-up is importing, or waits for it.
waiting = getattr(warmup, "waiting_for_fork", None)
while not entered.wait(0.05) and not (waiting is not None and waiting.is_set()):
    pass
pid = os.fork()  # TriggerRunnerSupervisor.start: a bare os.fork, the trigger runner in the child
if pid == 0:
    signal.alarm(120)  # the default action ends a child stuck on the lock
    import aiobotocore.httpsession  # the SQS stream's SDK, imported in the runner on its first stream
    os._exit(0)
release.set()
_, status = os.waitpid(pid, 0)
imported = os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0
print("runner imported its SDK" if imported else f"runner stuck: {status}")
"""


def test_the_runner_forked_during_the_warm_up_can_import_its_sdk() -> None:
    """
    Classes 7 and 10. The listener starts the warm-up when the triggerer's job has its id, and
    the supervisor then forks the trigger runner (``TriggerRunnerSupervisor.start``, a bare
    ``os.fork``) while the warm-up thread is importing the Execution API: 461 modules, aiohttp
    among them (with 72 of the modules aiobotocore needs, and cryptography's that Pub/Sub needs).
    A module a thread was importing at the fork stays locked in the child, by a thread the child
    does not have: the runner's first SQS stream imports aiobotocore, waits on aiohttp's lock
    forever, and the stream never starts, with no error. The gate holds the warm-up at one
    moment of that import, to make the race the fork runs every time.
    """
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-c", FORK_DURING_WARM_UP], capture_output=True, text=True, timeout=500
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "runner imported its SDK" in done.stdout, done.stdout
