"""The latency split of tests/support/pipeline.py: the Dag's own wait vs the scheduler's."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

from tests.support.airflow import DagRunRow
from tests.support.pipeline import could_start_at

T0 = datetime(2026, 11, 22, 4, 0, tzinfo=timezone.utc)


def _run(created: float, ended: float | None, run_after: float | None = None) -> DagRunRow:
    return DagRunRow(
        dag_id="d",
        run_id=f"r{created}",
        state="success" if ended is not None else "running",
        run_type="asset_triggered",
        created_at=T0 + timedelta(seconds=created),
        queued_at=None,
        start_date=None,
        end_date=None if ended is None else T0 + timedelta(seconds=ended),
        asset_event_ids=(),
        run_after=None if run_after is None else T0 + timedelta(seconds=run_after),
    )


def test_an_idle_dag_could_start_at_once() -> None:
    assert could_start_at(T0 + timedelta(seconds=5), [_run(0, 3)], max_active_runs=1) == T0 + timedelta(
        seconds=5
    )


def test_a_busy_dag_could_start_when_its_run_ends() -> None:
    assert could_start_at(T0 + timedelta(seconds=2), [_run(0, 30)], max_active_runs=1) == T0 + timedelta(
        seconds=30
    )


def test_with_two_slots_the_earlier_end_frees_one() -> None:
    runs = [_run(0, 30), _run(1, 20)]
    assert could_start_at(T0 + timedelta(seconds=2), runs, max_active_runs=2) == T0 + timedelta(seconds=20)
    assert could_start_at(T0 + timedelta(seconds=2), runs[:1], max_active_runs=2) == T0 + timedelta(seconds=2)


def test_a_run_still_active_never_frees_its_slot() -> None:
    assert could_start_at(T0 + timedelta(seconds=2), [_run(0, None)], max_active_runs=1).year == 9999


def test_an_event_after_a_runs_window_closed_waits_for_that_run() -> None:
    """Persisted between the run's newest queue row and its creation: the next run's to consume."""
    run = _run(created=10, ended=60, run_after=9.5)
    assert could_start_at(T0 + timedelta(seconds=9.8), [run], max_active_runs=1) == T0 + timedelta(seconds=60)
    assert could_start_at(T0 + timedelta(seconds=9.0), [run], max_active_runs=1) == T0 + timedelta(seconds=9)
