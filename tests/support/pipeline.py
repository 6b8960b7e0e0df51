"""
Observe the example pipelines in a running deployment: asset events, Dag runs, Spark, Parquet.

Shared by the e2e tests (which assert on it) and the demo (which prints it), so both report the
same numbers measured the same way.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from tests.support.airflow import AirflowDeployment, AssetEventRow, DagRunRow

SPARK_TASKS = ("spark_submit", "spark_submit_deferrable")
TERMINAL = {"success", "failed"}


def event_id_of(event: AssetEventRow, body_key: str) -> str | None:
    payload = event.payload or {}
    body = payload.get(body_key) if isinstance(payload, dict) else None
    return body.get("event_id") if isinstance(body, dict) else None


@dataclass
class PipelineState:
    """One snapshot of a broker's pipeline, restricted to a set of published event ids."""

    asset_events: dict[str, list[str]] = field(default_factory=dict)
    """asset name -> event ids of its asset events (duplicates kept: delivery is at least once)."""
    first_asset_event: dict[str, AssetEventRow] = field(default_factory=dict)
    """event id -> its earliest asset event."""
    runs: list[DagRunRow] = field(default_factory=list)
    """Dag runs that consumed at least one of the asset events."""
    run_of_event: dict[str, DagRunRow] = field(default_factory=dict)
    """event id -> the first Dag run that consumed one of its asset events."""
    task_end: dict[tuple[str, str], datetime] = field(default_factory=dict)
    """(run_id, task_id) -> end of a successful task."""
    failed_tasks: list[tuple[str, str, str]] = field(default_factory=list)
    all_runs: list[DagRunRow] = field(default_factory=list)
    """Every run of the Dag (also those that consumed none of the events): they hold its slots."""
    max_active_runs: int = 16

    @property
    def event_ids(self) -> set[str]:
        return set(self.first_asset_event)

    def finished(self, expected_ids: set[str]) -> bool:
        """Every expected event has an asset event, consumed by a run whose Spark tasks succeeded."""
        if not expected_ids <= self.event_ids or not expected_ids <= self.run_of_event.keys():
            return False
        for event_id in expected_ids:
            run = self.run_of_event[event_id]
            if run.state not in TERMINAL or any((run.run_id, t) not in self.task_end for t in SPARK_TASKS):
                return False
        return True


def snapshot(
    airflow: AirflowDeployment, dag_id: str, source: str, body_key: str, ids: set[str]
) -> PipelineState:
    state = PipelineState()
    by_event_row: dict[int, str] = {}
    for event in airflow.asset_events():
        if not event.asset_name.startswith(f"{source}_"):
            continue
        event_id = event_id_of(event, body_key)
        if event_id not in ids:
            continue
        state.asset_events.setdefault(event.asset_name, []).append(event_id)
        state.first_asset_event.setdefault(event_id, event)
        by_event_row[event.id] = event_id
    state.max_active_runs = airflow.max_active_runs(dag_id)
    state.all_runs = airflow.dag_runs(dag_id)
    for run in state.all_runs:
        consumed = [by_event_row[i] for i in run.asset_event_ids if i in by_event_row]
        if not consumed:
            continue
        state.runs.append(run)
        for event_id in consumed:
            state.run_of_event.setdefault(event_id, run)
    run_ids = {r.run_id for r in state.runs}
    for ti in airflow.task_instances(dag_id):
        if ti.run_id not in run_ids:
            continue
        if ti.state == "success" and ti.end_date is not None:
            state.task_end[(ti.run_id, ti.task_id)] = ti.end_date
        elif ti.state in {"failed", "upstream_failed"}:
            state.failed_tasks.append((ti.run_id, ti.task_id, ti.state))
    return state


def stranded(airflow: AirflowDeployment, dag_id: str, state: PipelineState) -> bool:
    """
    Whether some asset events wait for a Dag run that Airflow will not create on its own.

    Airflow 3.3's asset-triggered run queue (ADRQ) has one row per (asset, Dag), created by the
    first event after the last run. A new run gets the asset events up to the newest row's
    creation time, then the rows are deleted: later events of already-queued assets are in no
    run and have no row left. The next asset event creates a run that consumes them; at the end
    of a finite batch no such event comes. True when every run is done, the queue is empty and
    some event is still unconsumed (docs/pipelines.rst, "Asset events can wait").
    """
    unconsumed = state.event_ids - state.run_of_event.keys()
    if not unconsumed or airflow.queued_assets(dag_id):
        return False
    return all(r.state in TERMINAL for r in airflow.dag_runs(dag_id))


def wait_for_pipeline(
    airflow: AirflowDeployment,
    dag_id: str,
    source: str,
    body_key: str,
    ids: set[str],
    expected_ids: set[str],
    timeout: float,
    progress: Callable[[PipelineState], None] | None = None,
) -> PipelineState:
    """
    Poll until :meth:`PipelineState.finished`; fail early, with the task log, if a task failed.

    Nothing is published to help: a message whose asset events no run consumes within
    ``timeout`` fails the wait, and the message says whether Airflow left them stranded
    (:func:`stranded`) or was still working on them.
    """
    deadline = time.monotonic() + timeout
    while True:
        airflow.check_alive()
        state = snapshot(airflow, dag_id, source, body_key, ids)
        if progress is not None:
            progress(state)
        if state.failed_tasks:
            run_id, task_id, _ = state.failed_tasks[0]
            raise AssertionError(
                f"{dag_id} task {task_id} failed in {run_id}:\n"
                f"{airflow.task_log(dag_id, run_id, task_id)[-6000:]}"
            )
        if state.finished(expected_ids):
            return state
        if time.monotonic() > deadline:
            raise AssertionError(describe_unfinished(airflow, dag_id, state, expected_ids, timeout))
        time.sleep(1.0)


def describe_unfinished(
    airflow: AirflowDeployment, dag_id: str, state: PipelineState, expected_ids: set[str], timeout: float
) -> str:
    """What is missing, in words: for the failure of a test and the demo's exit status."""
    no_event = sorted(expected_ids - state.event_ids)
    unconsumed = sorted((expected_ids & state.event_ids) - state.run_of_event.keys())
    parts = [f"{dag_id} did not finish within {timeout:.0f}s"]
    if no_event:
        parts.append(f"{len(no_event)} messages have no asset event ({no_event[:5]})")
    if unconsumed:
        why = (
            "stranded: every run is done and nothing is queued (apache/airflow#56050)"
            if stranded(airflow, dag_id, state)
            else "not consumed yet"
        )
        parts.append(f"{len(unconsumed)} asset events consumed by no run, {why} ({unconsumed[:5]})")
    parts.append(f"runs: {[(r.run_id, r.state) for r in state.runs]}; tasks done: {len(state.task_end)}")
    return "; ".join(parts)


def parquet_event_ids(table_dir: Path) -> list[str]:
    """``event_id`` of every row of a Parquet table directory (hive-partitioned), duplicates kept."""
    import pyarrow.dataset as ds

    if not table_dir.is_dir():
        return []
    dataset = ds.dataset(str(table_dir), format="parquet", partitioning="hive")
    return [str(v) for v in dataset.to_table(columns=["event_id"]).column("event_id").to_pylist()]


@dataclass(frozen=True)
class Latency:
    """Seconds from publishing a message to a milestone, over a batch of messages."""

    samples: tuple[float, ...]

    @property
    def p50(self) -> float:
        return statistics.median(self.samples)

    @property
    def p95(self) -> float:
        ordered = sorted(self.samples)
        return ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))]

    @property
    def p99(self) -> float:
        ordered = sorted(self.samples)
        return ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))]

    @property
    def max(self) -> float:
        return max(self.samples)

    def __str__(self) -> str:
        return (
            f"p50 {self.p50:.1f} s, p95 {self.p95:.1f} s, p99 {self.p99:.1f} s, max {self.max:.1f} s "
            f"(n={len(self.samples)})"
        )


def slot_taken_at(run: DagRunRow) -> datetime | None:
    """
    When ``run`` took one of the Dag's ``max_active_runs`` slots.

    At its creation, or, for an asset-triggered run, when its event window closed (its
    ``run_after``, the newest queue row's time) if that came first: an event persisted between
    the two is the next run's to consume, and with one slot that run can only follow this one.
    """
    if run.run_type == "asset_triggered" and run.run_after is not None and run.created_at is not None:
        return min(run.run_after, run.created_at)
    return run.created_at


def could_start_at(event_time: datetime, runs: Iterable[DagRunRow], max_active_runs: int) -> datetime:
    """
    The first moment at or after ``event_time`` when the Dag was below ``max_active_runs``.

    A run holds a slot from :func:`slot_taken_at` (queued runs count, as in the scheduler's
    check) to its end. Before that moment the wait is the Dag's own (``max_active_runs``);
    after it, a run that consumes the event is the scheduler's to create.
    """
    never = datetime.max.replace(tzinfo=timezone.utc)
    ends = sorted(
        r.end_date or never
        for r in runs
        if (taken := slot_taken_at(r)) is not None
        and taken < event_time
        and (r.end_date is None or r.end_date > event_time)
    )
    if len(ends) < max_active_runs:
        return event_time
    return ends[len(ends) - max_active_runs]


def latencies(
    state: PipelineState, published_at: dict[str, float], expected_ids: Iterable[str]
) -> dict[str, Latency]:
    """
    Message-to-milestone latencies of ``expected_ids``.

    ``published_at`` holds wall-clock publish times (``time.time()``). Milestones: the first
    asset event; the moment the Dag could start a run for it (:func:`could_start_at`); the
    creation and the start of the Dag run that consumed it (a created run waits while an earlier
    one runs: ``max_active_runs``); the end of each Spark task of that run. ``dag_wait`` and
    ``scheduler_wait`` are not from the message: could start minus the asset event (the Dag's own
    wait, while the runs before it hold its ``max_active_runs`` slots: their Spark tasks) and run
    created minus could start (the delay the scheduler adds).
    """
    out: dict[str, list[float]] = {
        "asset_event": [],
        "dag_wait": [],
        "could_start": [],
        "dag_run_created": [],
        "dag_run_started": [],
        "scheduler_wait": [],
    }
    out.update({f"{t}_finished": [] for t in SPARK_TASKS})
    for event_id in expected_ids:
        sent = published_at[event_id]
        event_time = state.first_asset_event[event_id].timestamp
        out["asset_event"].append(_epoch(event_time) - sent)
        could_start = could_start_at(event_time, state.all_runs or state.runs, state.max_active_runs)
        out["could_start"].append(_epoch(could_start) - sent)
        out["dag_wait"].append(_epoch(could_start) - _epoch(event_time))
        run = state.run_of_event[event_id]
        if run.created_at is not None:
            out["dag_run_created"].append(_epoch(run.created_at) - sent)
            out["scheduler_wait"].append(_epoch(run.created_at) - _epoch(could_start))
        if run.start_date is not None:
            out["dag_run_started"].append(_epoch(run.start_date) - sent)
        for task in SPARK_TASKS:
            end = state.task_end.get((run.run_id, task))
            if end is not None:
                out[f"{task}_finished"].append(_epoch(end) - sent)
    return {k: Latency(tuple(v)) for k, v in out.items() if v}


def _epoch(value: datetime) -> float:
    return (value if value.tzinfo else value.replace(tzinfo=timezone.utc)).timestamp()


LATENCY_COLUMNS = (
    ("asset_event", "message -> asset event"),
    ("could_start", "message -> Dag below max_active_runs (could start a run)"),
    ("dag_run_created", "message -> run created"),
    ("dag_run_started", "message -> run started"),
    *((f"{t}_finished", f"message -> {t} done") for t in SPARK_TASKS),
    ("dag_wait", "Dag's own wait: runs before it hold max_active_runs (could start - asset event)"),
    ("scheduler_wait", "scheduler wait (run created - could start)"),
)


def slot_holders(state: PipelineState, event_ids: Iterable[str]) -> dict[str, int]:
    """
    Run id -> how many of ``event_ids`` waited for that run's end before the Dag could start one.

    Names the run a message queued behind (with ``max_active_runs=1``, a burst published while
    the run before it runs its Spark tasks waits for that run's end).
    """
    runs = state.all_runs or state.runs
    held: dict[str, int] = {}
    for event_id in event_ids:
        event_time = state.first_asset_event[event_id].timestamp
        could_start = could_start_at(event_time, runs, state.max_active_runs)
        if could_start == event_time:
            continue
        for run in runs:
            if run.end_date == could_start:
                held[run.run_id] = held.get(run.run_id, 0) + 1
                break
    return held


def latency_table(rows: dict[str, dict[str, Latency]]) -> str:
    """A Markdown table: one row per scenario and milestone, p50 / p95 / max in seconds."""
    lines = ["| scenario | milestone | p50 | p95 | max | n |", "| --- | --- | --- | --- | --- | --- |"]
    for scenario, values in rows.items():
        for key, label in LATENCY_COLUMNS:
            if key in values:
                v = values[key]
                cells = f"{v.p50:.1f} s | {v.p95:.1f} s | {v.max:.1f} s | {len(v.samples)}"
                lines.append(f"| {scenario} | {label} | {cells} |")
    return "\n".join(lines)


def summarize_runs(state: PipelineState) -> dict[str, Any]:
    return {
        "dag_runs": len(state.runs),
        "succeeded": sum(r.state == "success" for r in state.runs),
        "spark_applications": sum(1 for key in state.task_end if key[1] in SPARK_TASKS),
    }


def dag_wait_note(state: PipelineState, event_ids: set[str], start_up_event: str | None) -> str | None:
    """A summary line naming the run most of ``event_ids`` queued behind, or None if none did."""
    held = slot_holders(state, event_ids)
    if not held:
        return None
    holder, count = max(held.items(), key=lambda item: item[1])
    start_up_run = state.run_of_event.get(start_up_event or "")
    start_up = start_up_run is not None and start_up_run.run_id == holder
    whose = " (the start-up event's run)" if start_up else ""
    return (
        f"{count} of {len(event_ids)} events waited for run {holder}{whose} to end: the Dag runs "
        f"{state.max_active_runs} run(s) at a time (max_active_runs) and a run lasts its Spark "
        "tasks; the scheduler's own delay is its wait row"
    )
