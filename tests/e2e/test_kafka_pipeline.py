"""
Kafka (noida-db) end to end on PostgreSQL: message in, Parquet out, every message consumed.

The Airflow deployment serves the Kafka pipeline and the Pub/Sub one (whose module runs next: see
``SHARED_DEPLOYMENTS`` in tests/e2e/conftest.py), on a fresh database of the session's PostgreSQL
15 cluster, with ``[shared_stream] requeue_stranded_asset_events`` on. The stream is published
once and nothing follows it: every message must reach a Dag run by itself.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.checks import Stream, assert_no_secret_in_airflow_logs, assert_outputs, count_asset_events
from tests.e2e.conftest import (
    KAFKA_DEAD_LETTER_TOPIC,
    KAFKA_GROUP_ID,
    KAFKA_TOPIC,
    WATCHERS,
    SharedStacks,
    Stack,
    pipeline_stack,
)
from tests.support.order_events import expectation, order_stream
from tests.support.pipeline import latencies, wait_for_pipeline
from tests.support.processes import wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(1200)]

BROKER = "kafka"
DAG_ID = "kafka_orders_pipeline"
KAFKA_WATCHERS = {w for w in WATCHERS if w.startswith("kafka_")}


@pytest.fixture(scope="module")
def stack(request: pytest.FixtureRequest, e2e_dir: Path, shared_stacks: SharedStacks) -> Iterator[Stack]:
    with pipeline_stack(request, e2e_dir, shared_stacks, BROKER) as stack:
        yield stack


def test_the_kafka_dag_parses_and_its_watchers_run(stack: Stack) -> None:
    airflow = stack.airflow
    assert airflow.database == "postgresql"
    assert airflow.import_errors() == []
    assert DAG_ID in airflow.parsed_dag_ids()
    assert airflow.watcher_trigger_ids().keys() >= KAFKA_WATCHERS
    assert "No data found" in airflow.cli("dags", "list-import-errors").stdout
    airflow.wait_for_watchers(KAFKA_WATCHERS)


def test_the_triggerer_builds_the_execution_api_before_the_first_figures(stack: Stack) -> None:
    """
    Issue 50: the supervisor builds its in-process Execution API on the first state store write
    it serves, on its main thread, and stops answering the runner meanwhile; the supervisor now
    builds it just before it forks its runner (execution_api_warmup, from runner_fork's hook).
    """
    triggerer_log = stack.airflow.log_path("triggerer")
    wait_until(
        lambda: "Warmed the in-process Execution API up" in triggerer_log.read_text(errors="replace"),
        120,
        "the triggerer's Execution API warm-up",
    )


def test_kafka_pipeline_end_to_end(stack: Stack, latency_log: dict[str, Any]) -> None:
    airflow = stack.airflow
    airflow.wait_for_watchers(KAFKA_WATCHERS)
    stream = Stream("kafka-e2e", lambda batch: stack.kafka.produce(KAFKA_TOPIC, batch))
    stream.publish(order_stream(24, tag="kafka-e2e", seed=11), every=0.05)
    want = expectation("kafka", stream.events)

    # The broker advances only what was persisted: once every asset event is in the database,
    # the group's committed offset reaches the end of the topic.
    wait_until(
        lambda: (
            count_asset_events(stack, "kafka", "value", stream.ids)
            >= sum(map(len, want.asset_events.values()))
        ),
        180,
        "the Kafka stream's asset events",
    )
    end = stack.kafka.end_offsets(KAFKA_TOPIC)
    wait_until(lambda: stack.kafka.committed(KAFKA_GROUP_ID, KAFKA_TOPIC) == end, 60, "offsets at the end")

    # No follow-up message: every asset event of the burst must be consumed by a run by itself.
    state = wait_for_pipeline(airflow, DAG_ID, "kafka", "value", stream.ids, set(want.rows), timeout=1080)
    assert_outputs(stack, "kafka", state, want, stream.ids)
    assert stack.kafka.committed(KAFKA_GROUP_ID, KAFKA_TOPIC) == stack.kafka.end_offsets(KAFKA_TOPIC)
    assert len(stream.events) == 24, "something published after the burst"

    dead = {v.get("event_id") for v in stack.kafka.read_all(KAFKA_DEAD_LETTER_TOPIC)}
    assert want.rejected
    assert want.rejected <= dead
    latency_log["Kafka (noida-db), PostgreSQL: 24 messages at 20/s"] = latencies(
        state, stream.published_at, want.rows
    )


def test_no_secret_in_airflow_logs(stack: Stack) -> None:
    assert_no_secret_in_airflow_logs(stack)
