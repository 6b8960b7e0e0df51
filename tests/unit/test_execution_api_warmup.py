"""The supervisor's first request during the warm-up waits for it: one build, never two at once."""

from __future__ import annotations

import threading
from types import SimpleNamespace
from typing import Any

import pytest

from airflow_shared_stream import execution_api_warmup
from airflow_shared_stream.execution_api_warmup import ExecutionApiWarmup


@pytest.fixture(autouse=True)
def supervisor_forked(monkeypatch: pytest.MonkeyPatch) -> None:
    """The warm-up imports only after the supervisor forked its runner: it has, here."""
    forked = threading.Event()
    forked.set()
    monkeypatch.setattr(execution_api_warmup, "_forked", forked)


def test_a_first_request_during_the_warm_up_waits_for_its_instance(monkeypatch: pytest.MonkeyPatch) -> None:
    from airflow.jobs import triggerer_job_runner

    own_builds: list[object] = []
    monkeypatch.setattr(triggerer_job_runner, "in_process_api_server", lambda: own_builds.append(1))
    building, release = threading.Event(), threading.Event()
    warm = SimpleNamespace(app=SimpleNamespace(routes=[]))

    def slow_build() -> Any:
        building.set()
        release.wait()
        return warm

    monkeypatch.setattr(execution_api_warmup, "ready_in_process_api", slow_build)
    warmup = ExecutionApiWarmup(SimpleNamespace(job_type="TriggererJob", id=1))
    warmup.start()
    assert building.wait(30)
    got: list[object] = []
    asking = threading.Thread(target=lambda: got.append(triggerer_job_runner.in_process_api_server()))
    asking.start()  # the supervisor's first request, while the warm-up builds
    release.set()
    asking.join(30)
    warmup.join(30)
    assert got == [warm], "the supervisor built an instance of its own beside the warm-up's"
    assert not own_builds


def test_a_failed_warm_up_lets_the_supervisor_build_its_own(monkeypatch: pytest.MonkeyPatch) -> None:
    from airflow.jobs import triggerer_job_runner

    own = object()
    monkeypatch.setattr(triggerer_job_runner, "in_process_api_server", lambda: own)

    def failing_build() -> Any:
        raise RuntimeError("no database")

    monkeypatch.setattr(execution_api_warmup, "ready_in_process_api", failing_build)
    warmup = ExecutionApiWarmup(SimpleNamespace(job_type="TriggererJob", id=1))
    warmup.start()
    warmup.join(30)
    assert triggerer_job_runner.in_process_api_server() is own
