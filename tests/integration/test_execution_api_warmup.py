"""
The triggerer supervisor's in-process Execution API is ready before its first request (issue 50).

A busy demo's triggerer logged its runner "deadlocked" for 48 s: the supervisor's first asset
state store write (a stream's figures) made Airflow's in-process Execution API generate Cadwyn's
versioned routers, per app instance, on the supervisor's main thread (44-49 s at load 19, for
an instance built in 2 s once another had been). A warm-up that built a second instance and sent
it nothing left the supervisor's own instance to pay at its first request.
"""

from __future__ import annotations

import pytest

from airflow_shared_stream.execution_api_warmup import warm_up_before_fork

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]


def test_the_supervisors_in_process_api_is_ready_before_its_first_request(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from airflow.jobs import triggerer_job_runner

    # Restored after the test: the warm-up replaces it for the rest of its process.
    monkeypatch.setattr(
        triggerer_job_runner, "in_process_api_server", triggerer_job_runner.in_process_api_server
    )
    warmed = warm_up_before_fork()  # what the supervisor runs just before it forks its runner

    # What TriggerRunnerSupervisor.make_client asks for, at the supervisor's first request.
    api = triggerer_job_runner.in_process_api_server()
    assert api is warmed
    assert api.app._cadwyn_initialized, (
        "the supervisor's own API would generate its routers on its main thread"
    )
    assert triggerer_job_runner.in_process_api_server() is api
