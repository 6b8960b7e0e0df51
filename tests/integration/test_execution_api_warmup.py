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
    warmup = ExecutionApiWarmup(job)
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
