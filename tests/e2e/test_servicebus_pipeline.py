"""
Service Bus end to end on SQLite, against the AMQP test server (a protocol-level fake of Service
Bus that the real azure-servicebus SDK talks to; tests/support/servicebus_server.py).

A small burst (one or two Dag runs, to keep Spark's share of the suite small) is completed only
after persistence, every message is consumed by a Dag run without any follow-up message, and
malformed messages are dead-lettered with the rejecting watcher named. The deployment is shared
with the SQS pipeline's module (``SHARED_DEPLOYMENTS`` in tests/e2e/conftest.py).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.checks import Stream, assert_no_secret_in_airflow_logs, assert_outputs
from tests.e2e.conftest import WATCHERS, SharedStacks, Stack, pipeline_stack
from tests.support.order_events import expectation, order_stream
from tests.support.pipeline import latencies, wait_for_pipeline
from tests.support.processes import wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(1200)]

BROKER = "servicebus"
DAG_ID = "servicebus_orders_pipeline"
SERVICEBUS_WATCHERS = {w for w in WATCHERS if w.startswith("servicebus_")}


@pytest.fixture(scope="module")
def stack(request: pytest.FixtureRequest, e2e_dir: Path, shared_stacks: SharedStacks) -> Iterator[Stack]:
    with pipeline_stack(request, e2e_dir, shared_stacks, BROKER) as stack:
        yield stack


def test_the_servicebus_dag_parses_and_its_watchers_run(stack: Stack) -> None:
    airflow = stack.airflow
    assert airflow.import_errors() == []
    assert DAG_ID in airflow.parsed_dag_ids()
    assert airflow.watcher_trigger_ids().keys() >= SERVICEBUS_WATCHERS
    airflow.wait_for_watchers(SERVICEBUS_WATCHERS)


def test_servicebus_pipeline_end_to_end(stack: Stack, latency_log: dict[str, Any]) -> None:
    airflow = stack.airflow
    assert stack.servicebus is not None
    servicebus, queue = stack.servicebus, stack.servicebus_queue
    airflow.wait_for_watchers(SERVICEBUS_WATCHERS)
    stream = Stream("servicebus-e2e", lambda batch: servicebus.send(queue, batch))
    # One batch (one SDK client, one transfer): the burst lands in one or two Dag runs.
    stream.publish_at_once(order_stream(12, tag="servicebus-e2e", seed=13))

    # No follow-up message: every asset event must be consumed by a run by itself.
    want = expectation("servicebus", stream.events)
    state = wait_for_pipeline(airflow, DAG_ID, "servicebus", "body", stream.ids, set(want.rows), timeout=900)
    assert_outputs(stack, "servicebus", state, want, stream.ids)
    assert len(stream.events) == 12, "something published after the burst"

    # Completed only what was persisted: the queue drains; malformed messages were dead-lettered
    # with the reason and the rejecting watchers.
    wait_until(lambda: servicebus.messages(queue) == [], 90, "the queue to be empty")
    letters = servicebus.dead_letters(queue)
    dead = {json.loads(letter.body).get("event_id") for letter in letters}
    assert want.rejected
    assert want.rejected <= dead
    assert {letter.application_properties["DeadLetterReason"] for letter in letters} == {"rejected"}
    assert all(
        "trigger " in letter.application_properties["DeadLetterErrorDescription"] for letter in letters
    )
    latency_log["Service Bus (AMQP test server), SQLite: 12 messages at once"] = latencies(
        state, stream.published_at, want.rows
    )


def test_no_secret_in_airflow_logs(stack: Stack) -> None:
    assert_no_secret_in_airflow_logs(stack)
