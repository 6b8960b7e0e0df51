"""
The Streams page answers in bounded time however its brokers behave: the api-server answers
every request on one event loop, so what a backlog read does synchronously holds all of them,
and reads waited on one after another add up their timeouts.

* A page looked at with no broker SDK imported yet (the api-server's first look) imports the
  broker's operations, and its SDK, in a worker thread, never on the loop's own thread: checked
  in a fresh interpreter, where the SDK really is cold, against moto.
* A stream's reads (its queue's and its dead-letter queue's) are in flight together: a proxy in
  front of moto holds each request until both are in, so reads waited on one after another
  never get an answer. No clock decides: the page's bound and the SDK's timeouts are set far
  beyond the test's own guard.
"""

from __future__ import annotations

import asyncio
import json

import pytest

from airflow_shared_stream.console import backlog
from airflow_shared_stream.console.backlog import broker_backlog
from airflow_shared_stream.sqs import operations as sqs_operations
from tests.support.brokers import SqsServer
from tests.support.cold_probe import run_cold_probe
from tests.support.gathering_forwarder import GatheringForwarder

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]


def test_a_cold_page_imports_the_broker_sdk_off_the_event_loop(sqs: SqsServer) -> None:
    found = run_cold_probe("tests.support.console_cold_start_probe", sqs)
    assert found["imported_on_the_loop"] == [], (
        f"{len(found['imported_on_the_loop'])} SDK modules imported on the loop's thread, first "
        f"{found['imported_on_the_loop'][:5]}"
    )
    assert found["backlog"]["source"]["visible"] == 1, found["backlog"]


async def test_a_streams_reads_are_in_flight_together(
    sqs: SqsServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(backlog, "CACHE_SECONDS", 0.0)
    # The test's timeout is the guard: neither bound may end a read that waits for its sibling.
    monkeypatch.setattr(backlog, "TIMEOUT_SECONDS", 3600.0)
    monkeypatch.setattr(sqs_operations, "SDK_TIMEOUT_SECONDS", 3600)
    dead_letter_queue_url = sqs.create_queue()
    queue_url = sqs.create_queue(dead_letter_queue_url=dead_letter_queue_url)
    sqs.send(queue_url, [{"n": n} for n in range(3)])
    sqs.send(dead_letter_queue_url, [{"n": n} for n in range(2)])

    async with GatheringForwarder(sqs.port, together=2) as proxy:
        connection = {**sqs.connection()}
        connection["extra"] = {**connection["extra"], "endpoint_url": f"http://127.0.0.1:{proxy.port}"}
        monkeypatch.setenv("AIRFLOW_CONN_AWS_DEFAULT", json.dumps(connection))
        found = await asyncio.wait_for(  # a failure detector, far beyond both reads' own time
            broker_backlog("sqs", {"queue_url": queue_url, "dead_letter_queue_url": dead_letter_queue_url}),
            120,
        )

    assert found is not None
    assert found["source"] == {"visible": 3, "in_flight": 0, "depth": 3}
    assert found["dead_letter"] == {"visible": 2, "in_flight": 0, "depth": 2}
