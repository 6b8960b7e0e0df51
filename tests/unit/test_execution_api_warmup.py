"""A warm-up that fails leaves the supervisor to build its own Execution API, as Airflow does."""

from __future__ import annotations

from typing import Any

import pytest

from airflow_shared_stream import execution_api_warmup
from airflow_shared_stream.execution_api_warmup import warm_up_before_fork


def test_a_failed_warm_up_lets_the_supervisor_build_its_own(monkeypatch: pytest.MonkeyPatch) -> None:
    from airflow.jobs import triggerer_job_runner

    own = object()
    monkeypatch.setattr(triggerer_job_runner, "in_process_api_server", lambda: own)

    def failing_build() -> Any:
        raise RuntimeError("no database")

    monkeypatch.setattr(execution_api_warmup, "ready_in_process_api", failing_build)
    assert warm_up_before_fork() is None  # never raises into the fork hook
    assert triggerer_job_runner.in_process_api_server() is own
