"""
Message in, Parquet out: the example pipelines on a real broker, Spark cluster and Airflow.

For each broker: publish a stream of order events and assert that every message produced the
asset events its watchers match (and only those), that the Dag ran its Spark application with
both operators, that each Parquet output holds exactly one row per valid matched message, that
malformed messages reached the dead-letter path, and that the broker advanced only what was
persisted. Then SIGKILL the triggerer mid-stream and prove nothing was lost.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.conftest import KAFKA_DEAD_LETTER_TOPIC, KAFKA_GROUP_ID, KAFKA_TOPIC, WATCHERS, Stack
from tests.support.order_events import Expectation, expectation, order_stream
from tests.support.pipeline import (
    SPARK_TASKS,
    PipelineState,
    latencies,
    parquet_event_ids,
    wait_for_pipeline,
)
from tests.support.processes import wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]

KAFKA_DAG = "kafka_orders_pipeline"
SQS_DAG = "sqs_orders_pipeline"


def _assert_outputs(
    stack: Stack, source: str, state: PipelineState, want: Expectation, ids: set[str]
) -> None:
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


def _publish_paced(
    send: Any, events: list[dict[str, Any]], published_at: dict[str, float], every: float
) -> None:
    for event in events:
        published_at[event["event_id"]] = time.time()
        send([event])
        time.sleep(every)


def test_kafka_pipeline_end_to_end(stack: Stack, latency_log: dict[str, Any]) -> None:
    airflow = stack.airflow
    airflow.wait_for_watchers({w for w in WATCHERS if w.startswith("kafka_")})
    events = order_stream(24, tag="kafka-e2e", seed=11)
    ids = {e["event_id"] for e in events}
    want = expectation("kafka", events)

    published_at: dict[str, float] = {}
    _publish_paced(lambda batch: stack.kafka.produce(KAFKA_TOPIC, batch), events, published_at, every=0.1)

    state = wait_for_pipeline(airflow, KAFKA_DAG, "kafka", "value", ids, want.rows, timeout=420)
    _assert_outputs(stack, "kafka", state, want, ids)

    # The broker advanced only what was persisted: by now everything was, so the group's
    # committed offset is the end of the topic.
    end = stack.kafka.end_offsets(KAFKA_TOPIC)
    wait_until(
        lambda: stack.kafka.committed(KAFKA_GROUP_ID, KAFKA_TOPIC) == end, 30, "offsets committed to end"
    )
    dead = {v.get("event_id") for v in stack.kafka.read_all(KAFKA_DEAD_LETTER_TOPIC)}
    assert want.rejected <= dead
    latency_log["Kafka (noida-db), 24 messages paced 0.1 s"] = latencies(state, published_at, want.rows)


def test_sqs_pipeline_end_to_end(stack: Stack, latency_log: dict[str, Any]) -> None:
    airflow = stack.airflow
    airflow.wait_for_watchers({w for w in WATCHERS if w.startswith("sqs_")})
    events = order_stream(24, tag="sqs-e2e", seed=12)
    ids = {e["event_id"] for e in events}
    want = expectation("sqs", events)

    published_at: dict[str, float] = {}
    _publish_paced(lambda batch: stack.sqs.send(stack.sqs_queue_url, batch), events, published_at, every=0.1)

    state = wait_for_pipeline(airflow, SQS_DAG, "sqs", "body", ids, want.rows, timeout=420)
    _assert_outputs(stack, "sqs", state, want, ids)

    # Deleted only after persistence: nothing visible, nothing in flight.
    wait_until(
        lambda: sum(stack.sqs.depth(stack.sqs_queue_url).values()) == 0, 60, "the orders queue to be empty"
    )
    dead = {v.get("event_id") for v in stack.sqs.drain(stack.sqs_dead_letter_queue_url)}
    assert want.rejected <= dead
    latency_log["SQS (moto), 24 messages paced 0.1 s"] = latencies(state, published_at, want.rows)


def test_triggerer_sigkill_mid_stream_loses_nothing(stack: Stack, latency_log: dict[str, Any]) -> None:
    """
    SIGKILL the triggerer while messages are arriving, restart it: every message still lands.

    Runs on SQS: messages the dead triggerer received but had not settled come back when their
    visibility lapses. (noida-db never evicts a SIGKILLed group member, so a restarted Kafka
    consumer of the same group would wait forever there; the Kafka suite covers that broker
    with Tansu.)
    """
    airflow = stack.airflow
    airflow.wait_for_watchers({w for w in WATCHERS if w.startswith("sqs_")})
    events = order_stream(40, tag="sqs-kill", seed=13)
    ids = {e["event_id"] for e in events}
    want = expectation("sqs", events)
    published_at: dict[str, float] = {}

    publisher = threading.Thread(
        target=_publish_paced,
        args=(lambda batch: stack.sqs.send(stack.sqs_queue_url, batch), events, published_at, 0.25),
    )
    publisher.start()
    try:
        # Kill once some, not all, of the stream has become asset events.
        wait_until(
            lambda: len(_sqs_asset_event_ids(stack, ids)) >= 8, 120, "the first asset events of the stream"
        )
        killed_at = time.time()
        airflow.kill_triggerer()
        before_kill = _sqs_asset_event_ids(stack, ids)
        time.sleep(2)
        airflow.restart_triggerer()
    finally:
        publisher.join()
    assert len(before_kill) < len(want.rows), "the kill came after the whole stream was processed"

    state = wait_for_pipeline(airflow, SQS_DAG, "sqs", "body", ids, want.rows, timeout=480)
    _assert_outputs(stack, "sqs", state, want, ids)
    wait_until(
        lambda: sum(stack.sqs.depth(stack.sqs_queue_url).values()) == 0, 90, "the orders queue to be empty"
    )
    dead = {v.get("event_id") for v in stack.sqs.drain(stack.sqs_dead_letter_queue_url)}
    assert want.rejected <= dead
    after_kill = [i for i in ids if published_at[i] >= killed_at]
    print(f"published after the kill: {len(after_kill)}; asset events before it: {len(before_kill)}")
    latency_log["SQS (moto), 40 messages, triggerer SIGKILLed mid-stream"] = latencies(
        state, published_at, want.rows
    )


def _sqs_asset_event_ids(stack: Stack, ids: set[str]) -> set[str]:
    found = set()
    for event in stack.airflow.asset_events():
        body = (event.payload or {}).get("body") if isinstance(event.payload, dict) else None
        if isinstance(body, dict) and body.get("event_id") in ids:
            found.add(body["event_id"])
    return found


def test_no_secret_in_airflow_logs(stack: Stack) -> None:
    """The Spark REST token (a connection password) never reaches a process or task log."""
    logs = [
        *stack.airflow.home.joinpath("process-logs").glob("*.log"),
        *stack.airflow.home.joinpath("logs").rglob("*"),
    ]
    texts = [p.read_text(errors="replace") for p in logs if isinstance(p, Path) and p.is_file()]
    assert texts
    for text in texts:
        assert stack.spark.token not in text
