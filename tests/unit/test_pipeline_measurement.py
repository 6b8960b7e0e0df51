"""The latency split of tests/support/pipeline.py: the Dag's own wait vs the scheduler's."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from tests.support.airflow import AssetEventRow, DagRunRow
from tests.support.pipeline import (
    LATENCY_COLUMNS,
    PipelineState,
    could_start_at,
    dag_wait_note,
    latencies,
    slot_holders,
)

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


def _state_with_one_slot_held(event_at: float, holder_end: float, own_run_created: float) -> PipelineState:
    """One event persisted while an earlier run (the start-up event's) holds the only slot."""
    holder = _run(created=0, ended=holder_end, run_after=0)
    own = _run(created=own_run_created, ended=own_run_created + 60, run_after=own_run_created)
    event = AssetEventRow(
        id=1, asset_name="a", asset_uri="a", timestamp=T0 + timedelta(seconds=event_at), extra={}
    )
    return PipelineState(
        first_asset_event={"e": event},
        runs=[own],
        run_of_event={"e": own},
        all_runs=[holder, own],
        max_active_runs=1,
    )


def test_the_dags_own_wait_is_reported_apart_from_the_message_and_the_scheduler() -> None:
    """Issue 50: a message waiting ~3 min for the run before it is the Dag's max_active_runs, said so."""
    state = _state_with_one_slot_held(event_at=1.0, holder_end=180.0, own_run_created=180.4)
    published = {"e": T0.timestamp() + 0.5}
    found = latencies(state, published, ["e"])
    assert found["asset_event"].p50 == pytest.approx(0.5)
    assert found["dag_wait"].p50 == pytest.approx(179.0)  # the run before held the only slot
    assert found["scheduler_wait"].p50 == pytest.approx(0.4)
    labels = dict(LATENCY_COLUMNS)
    assert "max_active_runs" in labels["could_start"]
    assert "max_active_runs" in labels["dag_wait"]


def test_the_summary_names_the_run_that_held_the_slot() -> None:
    state = _state_with_one_slot_held(event_at=1.0, holder_end=180.0, own_run_created=180.4)
    held = slot_holders(state, ["e"])
    assert held == {"r0": 1}
    state.run_of_event["start-up"] = state.all_runs[0]
    note = dag_wait_note(state, {"e"}, "start-up")
    assert note is not None
    assert "run r0 (the start-up event's run)" in note
