"""
The trigger against a recording HTTP server that answers like a Spark master (loopback).

Used where the real cluster cannot show what matters: which request carried the JWS token,
and how many requests thousands of waiting triggers cost the master.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from typing import Any

import pytest

from airflow_shared_stream.spark.triggers import SparkApplicationTrigger
from tests.support.fake_spark_master import FakeDriver, FakeSparkMaster

pytestmark = pytest.mark.integration

TOKEN = "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJhaXJmbG93In0.recording-master-token"
TRACEBACK = 'Traceback (most recent call last):\n  File "app.py", line 1\nRuntimeError: batch 9 is corrupt\n'


@pytest.fixture
def master(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeSparkMaster]:
    with FakeSparkMaster(token=TOKEN) as server:
        monkeypatch.setenv("AIRFLOW_CONN_SPARK_REC", json.dumps(server.connection()))
        yield server


async def _first_event(trigger: SparkApplicationTrigger, timeout: float = 30) -> dict[str, Any]:
    async def first() -> dict[str, Any]:
        async for event in trigger.run():
            return event.payload
        raise AssertionError("trigger ended without an event")

    return await asyncio.wait_for(first(), timeout)


async def test_token_goes_only_to_the_rest_endpoint(master: FakeSparkMaster):
    master.drivers["driver-failed"] = FakeDriver(state="FAILED", stdout=TRACEBACK)
    event = await _first_event(SparkApplicationTrigger(submission_id="driver-failed", conn_id="spark_rec"))
    assert event["status"] == "failed", event
    # The failure summary really read the master UI and the worker UI...
    assert "RuntimeError: batch 9 is corrupt" in event["message"], event
    paths = [r.path.split("?")[0] for r in master.requests]
    assert "/json/" in paths and "/log/" in paths, paths
    # ...and only REST requests carried the token.
    for request in master.requests:
        if request.path.startswith("/v1/"):
            assert request.authorization == f"Bearer {TOKEN}", request
        else:
            assert request.authorization is None, f"the JWS token was sent to {request.path}"


async def test_kill_and_deadline_send_the_token_only_to_rest(master: FakeSparkMaster):
    master.drivers["driver-slow"] = FakeDriver(state="RUNNING")
    trigger = SparkApplicationTrigger(
        submission_id="driver-slow", conn_id="spark_rec", poll_interval=0.2, deadline=time.time() + 1
    )
    event = await _first_event(trigger)
    assert event["status"] == "timeout", event
    assert event["driver_state"] == "KILLED"
    assert any(r.path.startswith("/v1/submissions/kill/") for r in master.requests)
    assert all((r.authorization is not None) == r.path.startswith("/v1/") for r in master.requests), (
        master.requests
    )
