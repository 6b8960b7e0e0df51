"""
Message in, Parquet out: the example pipelines on a real broker, Spark cluster and Airflow.

For each broker: publish a stream of order events and assert that every message produced the
asset events its watchers match (and only those), that every Dag run ran the Spark application
with both operators, that each Parquet output holds exactly one row per valid matched message,
that malformed messages reached the dead-letter path, and that the broker advanced only what was
persisted. The SQS stream is published while the triggerer is SIGKILLed and restarted.
"""

from __future__ import annotations

import json
import threading
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest

from tests.e2e.conftest import KAFKA_DEAD_LETTER_TOPIC, KAFKA_GROUP_ID, KAFKA_TOPIC, WATCHERS, Stack
from tests.support.order_events import Expectation, expectation, order_stream
from tests.support.pipeline import SPARK_TASKS, PipelineState, latencies, parquet_event_ids, wait_for_pipeline
from tests.support.processes import wait_until

# Spark dominates: each application takes 1-2.5 min on two shared cores.
pytestmark = [pytest.mark.e2e, pytest.mark.timeout(1200)]

KAFKA_DAG = "kafka_orders_pipeline"
SQS_DAG = "sqs_orders_pipeline"
SERVICEBUS_DAG = "servicebus_orders_pipeline"


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


class Stream:
    """Publishes order events to one broker and remembers what it sent, and when."""

    def __init__(self, tag: str, send: Callable[[list[dict[str, Any]]], Any]) -> None:
        self.tag = tag
        self.send = send
        self.events: list[dict[str, Any]] = []
        self.published_at: dict[str, float] = {}
        self._nudges = 0

    @property
    def ids(self) -> set[str]:
        return {e["event_id"] for e in self.events}

    def publish(self, events: list[dict[str, Any]], every: float = 0.0) -> None:
        for event in events:
            self.events.append(event)
            self.published_at[event["event_id"]] = time.time()
            self.send([event])
            if every:
                time.sleep(every)

    def nudge(self) -> set[str]:
        """One more valid order, as the live stream's next message (see ``pipeline.stranded``)."""
        self._nudges += 1
        event = {
            **order_stream(1, tag=f"{self.tag}-next{self._nudges}", seed=self._nudges)[0],
            "type": "order_created",
            "order_id": f"o-next-{self._nudges}",
            "amount": 42.0,
        }
        self.publish([event])
        return {event["event_id"]}


def test_kafka_pipeline_end_to_end(stack: Stack, latency_log: dict[str, Any]) -> None:
    airflow = stack.airflow
    airflow.wait_for_watchers(WATCHERS)
    stream = Stream("kafka-e2e", lambda batch: stack.kafka.produce(KAFKA_TOPIC, batch))
    stream.publish(order_stream(24, tag="kafka-e2e", seed=11), every=0.05)
    want = expectation("kafka", stream.events)

    # The broker advances only what was persisted: once every asset event is in the database,
    # the group's committed offset reaches the end of the topic.
    wait_until(
        lambda: _count(stack, "kafka", "value", stream.ids) >= sum(map(len, want.asset_events.values())),
        180,
        "the Kafka stream's asset events",
    )
    end = stack.kafka.end_offsets(KAFKA_TOPIC)
    wait_until(lambda: stack.kafka.committed(KAFKA_GROUP_ID, KAFKA_TOPIC) == end, 60, "offsets at the end")

    ids, rows = stream.ids, want.rows
    state = wait_for_pipeline(
        airflow, KAFKA_DAG, "kafka", "value", ids, rows, timeout=1080, nudge=stream.nudge
    )
    want = expectation("kafka", stream.events)
    _assert_outputs(stack, "kafka", state, want, stream.ids)
    assert stack.kafka.committed(KAFKA_GROUP_ID, KAFKA_TOPIC) == stack.kafka.end_offsets(KAFKA_TOPIC)

    dead = {v.get("event_id") for v in stack.kafka.read_all(KAFKA_DEAD_LETTER_TOPIC)}
    assert want.rejected
    assert want.rejected <= dead
    latency_log["Kafka (noida-db): 24 messages at 20/s"] = latencies(state, stream.published_at, want.rows)


def test_sqs_pipeline_survives_triggerer_sigkill(stack: Stack, latency_log: dict[str, Any]) -> None:
    """
    SQS end to end with the triggerer SIGKILLed mid-stream and restarted: nothing is lost.

    Messages the dead triggerer had received but not settled come back when their visibility
    lapses (the queue's 20 s) and become asset events in the restarted triggerer; messages sent
    while no triggerer ran wait on the queue. Runs after the Kafka test on purpose: noida-db
    never evicts a SIGKILLed group member, so the restarted triggerer's Kafka consumer cannot
    rejoin its group there (the Kafka suite covers crash recovery on Tansu).
    """
    airflow = stack.airflow
    airflow.wait_for_watchers({w for w in WATCHERS if w.startswith("sqs_")})
    stream = Stream("sqs-e2e", lambda batch: stack.sqs.send(stack.sqs_queue_url, batch))
    publisher = threading.Thread(target=stream.publish, args=(order_stream(30, tag="sqs-e2e", seed=12), 0.25))
    publisher.start()
    try:
        # Kill once some, not all, of the stream has become asset events.
        wait_until(lambda: _distinct(stack, "sqs", "body", stream.ids) >= 6, 120, "first SQS asset events")
        killed_at = time.time()
        airflow.kill_triggerer()
        before_kill = _distinct(stack, "sqs", "body", stream.ids)
        time.sleep(2)
        airflow.restart_triggerer()
    finally:
        publisher.join()
    sent_after_kill = sum(t >= killed_at for t in stream.published_at.values())
    assert 0 < before_kill < len(stream.events)
    assert sent_after_kill > 0, "the kill came after the whole stream was published"

    ids, rows = stream.ids, expectation("sqs", stream.events).rows
    state = wait_for_pipeline(airflow, SQS_DAG, "sqs", "body", ids, rows, timeout=1080, nudge=stream.nudge)
    want = expectation("sqs", stream.events)
    _assert_outputs(stack, "sqs", state, want, stream.ids)

    # Deleted only after persistence: nothing visible, nothing in flight; malformed ones on the DLQ.
    wait_until(lambda: sum(stack.sqs.depth(stack.sqs_queue_url)) == 0, 90, "the queue to be empty")
    dead_letters = stack.sqs.drain(stack.sqs_dead_letter_queue_url)
    dead = {json.loads(m["Body"]).get("event_id") for m in dead_letters}
    assert want.rejected
    assert want.rejected <= dead
    print(
        f"SIGKILL after {before_kill} asset events, {sent_after_kill} messages sent after it; "
        f"{sum(map(len, state.asset_events.values()))} asset events for "
        f"{sum(map(len, want.asset_events.values()))} expected (extra ones are redeliveries)"
    )
    latency_log["SQS (moto): 30 messages at 4/s, triggerer SIGKILLed mid-stream"] = latencies(
        state, stream.published_at, want.rows
    )


def test_servicebus_pipeline_end_to_end(stack: Stack, latency_log: dict[str, Any]) -> None:
    """
    Service Bus end to end against the AMQP test server: a small burst (one or two Dag runs, to
    keep Spark's share of the suite small), completed only after persistence, malformed messages
    dead-lettered with the rejecting watcher named.
    """
    airflow = stack.airflow
    airflow.wait_for_watchers({w for w in WATCHERS if w.startswith("servicebus_")})
    queue = stack.servicebus_queue
    stream = Stream("servicebus-e2e", lambda batch: stack.servicebus.send(queue, batch))
    # One batch (one SDK client, one transfer): the burst lands in one or two Dag runs.
    burst = order_stream(12, tag="servicebus-e2e", seed=13)
    stream.events.extend(burst)
    stream.published_at.update({event["event_id"]: time.time() for event in burst})
    stream.send(burst)

    ids, rows = stream.ids, expectation("servicebus", stream.events).rows
    state = wait_for_pipeline(
        airflow, SERVICEBUS_DAG, "servicebus", "body", ids, rows, timeout=900, nudge=stream.nudge
    )
    want = expectation("servicebus", stream.events)  # with the nudges, if any were needed
    _assert_outputs(stack, "servicebus", state, want, stream.ids)

    # Completed only what was persisted: the queue drains; malformed messages were dead-lettered
    # with the reason and the rejecting watchers.
    wait_until(lambda: stack.servicebus.messages(queue) == [], 90, "the queue to be empty")
    letters = stack.servicebus.dead_letters(queue)
    dead = {json.loads(letter.body).get("event_id") for letter in letters}
    assert want.rejected
    assert want.rejected <= dead
    assert {letter.application_properties["DeadLetterReason"] for letter in letters} == {"rejected"}
    assert all(
        "trigger " in letter.application_properties["DeadLetterErrorDescription"] for letter in letters
    )
    latency_log["Service Bus (AMQP test server): 12 messages at once"] = latencies(
        state, stream.published_at, want.rows
    )


def _count(stack: Stack, source: str, body_key: str, ids: set[str]) -> int:
    """How many asset events the messages in ``ids`` have produced so far."""
    return sum(map(len, _asset_event_ids(stack, source, body_key, ids).values()))


def _asset_event_ids(stack: Stack, source: str, body_key: str, ids: set[str]) -> dict[str, list[str]]:
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


def _distinct(stack: Stack, source: str, body_key: str, ids: set[str]) -> int:
    """How many of ``ids`` have at least one asset event."""
    return len({i for found in _asset_event_ids(stack, source, body_key, ids).values() for i in found})


def test_no_secret_in_airflow_logs(stack: Stack) -> None:
    """The Spark REST token (a connection password) never reaches a process or task log."""
    home = stack.airflow.home
    paths = [*home.joinpath("process-logs").glob("*.log"), *home.joinpath("logs").rglob("*.log")]
    texts = [p.read_text(errors="replace") for p in paths]
    assert any("spark_submit_deferrable" in t for t in texts)
    for text in texts:
        assert stack.spark.token not in text
