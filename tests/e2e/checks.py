"""
What every pipeline test checks, shared by the per-broker e2e modules.

Nothing here publishes anything to help a pipeline along: a message that no Dag run consumes
fails the test (``tests/support/pipeline.wait_for_pipeline``).
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from typing import Any

from tests.e2e.conftest import Stack
from tests.support.order_events import Expectation
from tests.support.pipeline import SPARK_TASKS, PipelineState, parquet_event_ids


def assert_outputs(stack: Stack, source: str, state: PipelineState, want: Expectation, ids: set[str]) -> None:
    # Each message produced an asset event for exactly the assets whose watcher matches it.
    got = {asset: set(found) for asset, found in state.asset_events.items()}
    assert got == {asset: ids_ for asset, ids_ in want.asset_events.items() if ids_}
    # Rejected messages never became asset events.
    assert not (state.event_ids & want.rejected)
    # Every run that consumed them ran both Spark applications.
    for run in state.runs:
        assert run.state == "success", run
        for task in SPARK_TASKS:
            assert (run.run_id, task) in state.task_end, (run.run_id, task)
    # Each Spark output holds exactly the expected rows: every valid matched message once.
    for task in SPARK_TASKS:
        rows = [r for r in parquet_event_ids(stack.data_dir / source / task / "orders") if r in ids]
        duplicates = [r for r, n in Counter(rows).items() if n > 1]
        assert not duplicates, f"{task}: duplicate rows {duplicates}"
        assert set(rows) == want.rows, (
            f"{task}: missing {want.rows - set(rows)}, extra {set(rows) - want.rows}"
        )


class Stream:
    """Publishes order events to one broker and remembers what it sent, and when."""

    def __init__(self, tag: str, send: Callable[[list[dict[str, Any]]], Any]) -> None:
        self.tag = tag
        self.send = send
        self.events: list[dict[str, Any]] = []
        self.published_at: dict[str, float] = {}

    @property
    def ids(self) -> set[str]:
        return {e["event_id"] for e in self.events}

    def publish_at_once(self, events: list[dict[str, Any]]) -> None:
        """All of ``events`` in one send (one broker request): a burst that lands together."""
        self.events.extend(events)
        sent_at = time.time()
        self.published_at.update({event["event_id"]: sent_at for event in events})
        self.send(events)

    def publish(self, events: list[dict[str, Any]], every: float = 0.0) -> None:
        for event in events:
            self.events.append(event)
            self.published_at[event["event_id"]] = time.time()
            self.send([event])
            if every:
                time.sleep(every)


def count_asset_events(stack: Stack, source: str, body_key: str, ids: set[str]) -> int:
    """How many asset events the messages in ``ids`` have produced so far."""
    return sum(map(len, asset_event_ids(stack, source, body_key, ids).values()))


def asset_event_ids(stack: Stack, source: str, body_key: str, ids: set[str]) -> dict[str, list[str]]:
    """asset name -> event ids of its asset events among ``ids``."""
    found: dict[str, list[str]] = {}
    for event in stack.airflow.asset_events():
        payload = event.payload if isinstance(event.payload, dict) else {}
        body = payload.get(body_key)
        if (
            event.asset_name.startswith(f"{source}_")
            and isinstance(body, dict)
            and body.get("event_id") in ids
        ):
            found.setdefault(event.asset_name, []).append(body["event_id"])
    return found


def distinct_events(stack: Stack, source: str, body_key: str, ids: set[str]) -> int:
    """How many of ``ids`` have at least one asset event."""
    return len({i for found in asset_event_ids(stack, source, body_key, ids).values() for i in found})


def assert_no_secret_in_airflow_logs(stack: Stack) -> None:
    """The Spark REST token (a connection password) never reaches a process or task log."""
    home = stack.airflow.home
    paths = [*home.joinpath("process-logs").glob("*.log"), *home.joinpath("logs").rglob("*.log")]
    texts = [p.read_text(errors="replace") for p in paths]
    assert any("spark_submit_deferrable" in t for t in texts)
    for text in texts:
        assert stack.spark.token not in text
