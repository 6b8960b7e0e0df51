"""
SQS (moto) end to end on SQLite, with the triggerer SIGKILLed mid-stream: nothing is lost, and
every message is consumed by a Dag run without any follow-up message.

The Airflow deployment serves the SQS pipeline and the Service Bus one (whose module runs before
this one: see ``SHARED_DEPLOYMENTS`` in tests/e2e/conftest.py), on SQLite (the embedded default),
with ``[shared_stream] requeue_stranded_asset_events`` on.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.checks import Stream, assert_no_secret_in_airflow_logs, assert_outputs, distinct_events
from tests.e2e.conftest import WATCHERS, SharedStacks, Stack, pipeline_stack
from tests.support.order_events import expectation, order_stream
from tests.support.pipeline import latencies, wait_for_pipeline
from tests.support.processes import wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(1200)]

BROKER = "sqs"
DAG_ID = "sqs_orders_pipeline"
SQS_WATCHERS = {w for w in WATCHERS if w.startswith("sqs_")}


@pytest.fixture(scope="module")
def stack(request: pytest.FixtureRequest, e2e_dir: Path, shared_stacks: SharedStacks) -> Iterator[Stack]:
    with pipeline_stack(request, e2e_dir, shared_stacks, BROKER) as stack:
        yield stack


def test_the_sqs_dag_parses_and_its_watchers_run(stack: Stack) -> None:
    airflow = stack.airflow
    assert airflow.database == "sqlite"
    assert airflow.import_errors() == []
    assert DAG_ID in airflow.parsed_dag_ids()
    assert airflow.watcher_trigger_ids().keys() >= SQS_WATCHERS
    airflow.wait_for_watchers(SQS_WATCHERS)


def test_sqs_pipeline_survives_triggerer_sigkill(stack: Stack, latency_log: dict[str, Any]) -> None:
    """
    Messages the dead triggerer had received but not settled come back when their visibility
    lapses (the queue's 20 s) and become asset events in the restarted triggerer; messages sent
    while no triggerer ran wait on the queue.
    """
    airflow = stack.airflow
    airflow.wait_for_watchers(SQS_WATCHERS)
    stream = Stream("sqs-e2e", lambda batch: stack.sqs.send(stack.sqs_queue_url, batch))
    publisher = threading.Thread(target=stream.publish, args=(order_stream(30, tag="sqs-e2e", seed=12), 0.25))
    publisher.start()
    try:
        # Kill once some, not all, of the stream has become asset events.
        wait_until(
            lambda: distinct_events(stack, "sqs", "body", stream.ids) >= 6, 120, "first SQS asset events"
        )
        killed_at = time.time()
        airflow.kill_triggerer()
        # Received by the dead triggerer and not deleted: invisible until their visibility lapses
        # (nobody extends or settles them any more), so this counts what was in flight at the kill.
        in_flight_at_kill = stack.sqs.depth(stack.sqs_queue_url).in_flight
        before_kill = distinct_events(stack, "sqs", "body", stream.ids)
        # Restart once a message was sent while no triggerer ran: it must wait on the queue.
        wait_until(
            lambda: (
                not publisher.is_alive() or any(t >= killed_at for t in list(stream.published_at.values()))
            ),
            60,
            "a message sent after the kill",
            interval=0.05,
        )
        airflow.restart_triggerer()
    finally:
        publisher.join()
    sent_after_kill = sum(t >= killed_at for t in stream.published_at.values())
    assert 0 < before_kill < len(stream.events)
    # A kill between two persistence cycles, with every received message already deleted, would
    # prove nothing about at-least-once (messages arrive every 250 ms and wait >= 1 s to persist).
    assert in_flight_at_kill > 0, "nothing was in flight at the kill: it tested nothing"
    assert sent_after_kill > 0, "the kill came after the whole stream was published"

    # No follow-up message: every asset event must be consumed by a run by itself.
    want = expectation("sqs", stream.events)
    state = wait_for_pipeline(airflow, DAG_ID, "sqs", "body", stream.ids, set(want.rows), timeout=1080)
    assert_outputs(stack, "sqs", state, want, stream.ids)
    assert len(stream.events) == 30, "something published after the stream"

    # Deleted only after persistence: nothing visible, nothing in flight; malformed ones on the DLQ.
    wait_until(lambda: sum(stack.sqs.depth(stack.sqs_queue_url)) == 0, 90, "the queue to be empty")
    dead_letters = stack.sqs.drain(stack.sqs_dead_letter_queue_url)
    dead = {json.loads(m["Body"]).get("event_id") for m in dead_letters}
    assert want.rejected
    assert want.rejected <= dead
    print(
        f"SIGKILL after {before_kill} asset events with {in_flight_at_kill} message(s) in flight, "
        f"{sent_after_kill} messages sent after it; "
        f"{sum(map(len, state.asset_events.values()))} asset events for "
        f"{sum(map(len, want.asset_events.values()))} expected (extra ones are redeliveries)"
    )
    latency_log["SQS (moto), SQLite: 30 messages at 4/s, triggerer SIGKILLed mid-stream"] = latencies(
        state, stream.published_at, want.rows
    )


def test_no_secret_in_airflow_logs(stack: Stack) -> None:
    assert_no_secret_in_airflow_logs(stack)
