"""
Pub/Sub end to end on PostgreSQL, on Google's emulator: three watchers on one subscription,
Spark, Parquet; every message consumed by a Dag run without any follow-up message.

Kept short (a burst of 12 events in one request, so one or two Dag runs) to bound the suite's
time; the integration suite covers Pub/Sub's failure paths against the same emulator. The
deployment is the Kafka pipeline module's (``SHARED_DEPLOYMENTS`` in tests/e2e/conftest.py).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.checks import Stream, assert_no_secret_in_airflow_logs, assert_outputs
from tests.e2e.conftest import (
    PUBSUB_DEAD_LETTER_READER,
    PUBSUB_SUBSCRIPTION,
    PUBSUB_TOPIC,
    WATCHERS,
    SharedStacks,
    Stack,
    pipeline_stack,
)
from tests.support.order_events import expectation, order_stream
from tests.support.pipeline import latencies, wait_for_pipeline

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(1200)]

BROKER = "pubsub"
DAG_ID = "pubsub_orders_pipeline"
PUBSUB_WATCHERS = {w for w in WATCHERS if w.startswith("pubsub_")}


@pytest.fixture(scope="module")
def stack(request: pytest.FixtureRequest, e2e_dir: Path, shared_stacks: SharedStacks) -> Iterator[Stack]:
    with pipeline_stack(request, e2e_dir, shared_stacks, BROKER) as stack:
        yield stack


def test_the_pubsub_dag_parses_and_its_watchers_run(stack: Stack) -> None:
    airflow = stack.airflow
    assert airflow.database == "postgresql"
    assert airflow.import_errors() == []
    assert DAG_ID in airflow.parsed_dag_ids()
    assert airflow.watcher_trigger_ids().keys() >= PUBSUB_WATCHERS
    airflow.wait_for_watchers(PUBSUB_WATCHERS)


def test_pubsub_pipeline_end_to_end(stack: Stack, latency_log: dict[str, Any]) -> None:
    airflow = stack.airflow
    pubsub = stack.pubsub
    assert pubsub is not None
    airflow.wait_for_watchers(PUBSUB_WATCHERS)
    topic = pubsub.topic_path(PUBSUB_TOPIC)
    stream = Stream("pubsub-e2e", lambda batch: pubsub.publish(topic, batch))
    # One request: the burst lands in one or two Dag runs, however loaded the machine.
    stream.publish_at_once(order_stream(12, tag="pubsub-e2e", seed=14))

    # No follow-up message: every asset event must be consumed by a run by itself.
    want = expectation("pubsub", stream.events)
    state = wait_for_pipeline(airflow, DAG_ID, "pubsub", "body", stream.ids, set(want.rows), timeout=1080)
    assert_outputs(stack, "pubsub", state, want, stream.ids)
    assert len(stream.events) == 12, "something published after the burst"

    # Rejected ones were published to the dead-letter topic (then acknowledged), with the reason.
    dead_letters = pubsub.drain(pubsub.subscription_path(PUBSUB_DEAD_LETTER_READER))
    dead = {json.loads(m.message.data).get("event_id") for m in dead_letters}
    assert want.rejected
    assert want.rejected <= dead
    assert {dict(m.message.attributes)["dead_letter_reason"] for m in dead_letters} == {"rejected"}
    # Acknowledged: minutes after the burst, long past its 20 s ack deadline, nothing of the
    # stream is back on the subscription.
    left = pubsub.pull(pubsub.subscription_path(PUBSUB_SUBSCRIPTION), ack=False)
    assert [m.message.message_id for m in left] == []
    latency_log["Pub/Sub (emulator), PostgreSQL: 12 messages at once"] = latencies(
        state, stream.published_at, want.rows
    )


def test_no_secret_in_airflow_logs(stack: Stack) -> None:
    assert_no_secret_in_airflow_logs(stack)
