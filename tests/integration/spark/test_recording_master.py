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

from airflow_shared_stream.spark import poller
from airflow_shared_stream.spark.triggers import SparkApplicationTrigger
from tests.support.fake_spark_master import FakeDriver, FakeSparkMaster
from tests.support.waiting import eventually

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
    assert "/json/" in paths, paths
    assert "/log/" in paths, paths
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


def _trigger(submission_id: str, **kwargs: Any) -> SparkApplicationTrigger:
    kwargs.setdefault("poll_interval", 0.2)
    return SparkApplicationTrigger(submission_id=submission_id, conn_id="spark_rec", **kwargs)


def _count(master: FakeSparkMaster, prefix: str) -> int:
    return sum(1 for r in master.requests if r.path.startswith(prefix))


async def test_many_triggers_share_one_listing_per_interval(master: FakeSparkMaster):
    now = time.time()
    for i in range(200):
        master.drivers[f"driver-{i}"] = FakeDriver(
            finish_at=now + 1.5 + (i % 10) * 0.1, final_state="FINISHED" if i % 2 else "FAILED"
        )
    started = time.monotonic()
    events = await asyncio.gather(*(_first_event(_trigger(f"driver-{i}"), 120) for i in range(200)))
    elapsed = time.monotonic() - started
    assert [e["status"] for e in events] == ["failed" if i % 2 == 0 else "success" for i in range(200)]
    listings, statuses = _count(master, "/json/"), _count(master, "/v1/submissions/status/")
    # About one listing per 0.2 s interval (plus the one each failed driver's summary reads),
    # and no status request at all: the listing settled every driver.
    assert listings - 100 <= elapsed / 0.2 + 3, (listings, elapsed)
    assert statuses == 0, statuses
    assert not poller._POLLERS, "the poller outlived its last trigger"


async def test_unknown_driver_is_asked_over_rest_and_is_an_error(master: FakeSparkMaster):
    master.drivers["driver-known"] = FakeDriver(finish_at=time.time() + 1)
    known, unknown = await asyncio.gather(
        _first_event(_trigger("driver-known")), _first_event(_trigger("driver-nobody-knows"))
    )
    assert known["status"] == "success", known
    assert unknown["status"] == "error", unknown
    assert "does not know submission driver-nobody-knows" in unknown["message"]
    assert {r.path for r in master.requests if r.path.startswith("/v1/")} == {
        "/v1/submissions/status/driver-nobody-knows"
    }


async def test_each_trigger_keeps_its_own_transient_error_limit(master: FakeSparkMaster):
    master.drivers["driver-a"] = FakeDriver(finish_at=time.time() + 3)
    master.fail_next["/json/"] = 2
    strict, tolerant = await asyncio.gather(
        _first_event(_trigger("driver-a", max_transient_errors=1)),
        _first_event(_trigger("driver-a", max_transient_errors=5)),
    )
    assert strict["status"] == "error", strict
    assert "2 transient errors in a row" in strict["message"]
    assert tolerant["status"] == "success", tolerant


async def test_each_trigger_keeps_its_own_deadline_and_a_cancelled_one_leaves(master: FakeSparkMaster):
    master.drivers["driver-long"] = FakeDriver(state="RUNNING")
    master.drivers["driver-short"] = FakeDriver(state="RUNNING")
    master.drivers["driver-ends"] = FakeDriver(finish_at=time.time() + 2)
    cancelled = asyncio.ensure_future(_first_event(_trigger("driver-long")))
    timed_out, finished = await asyncio.gather(
        _first_event(_trigger("driver-short", deadline=time.time() + 1)),
        _first_event(_trigger("driver-ends", deadline=time.time() + 60)),
    )
    assert timed_out["status"] == "timeout", timed_out
    assert master.drivers["driver-short"].state == "KILLED"
    assert finished["status"] == "success", finished
    (shared,) = poller._POLLERS.values()
    assert shared.watching == 1
    cancelled.cancel()
    with pytest.raises(asyncio.CancelledError):
        await cancelled
    assert not poller._POLLERS
    assert shared._task is not None
    await asyncio.wait([shared._task], timeout=10)
    assert shared._task.done(), "the poller kept running with no trigger waiting"
    assert master.drivers["driver-long"].state == "RUNNING", "cancelling is not on_kill"


async def test_per_trigger_path_polls_rest_for_its_own_driver(master: FakeSparkMaster):
    master.drivers["driver-own"] = FakeDriver(finish_at=time.time() + 0.5)
    event = await _first_event(_trigger("driver-own", shared_poller=False))
    assert event["status"] == "success", event
    assert _count(master, "/json/") == 0
    assert _count(master, "/v1/submissions/status/driver-own") >= 1


async def test_unusable_listing_falls_back_to_rest_status(master: FakeSparkMaster):
    """A web UI behind an authentication filter: the poller asks each driver over REST instead."""
    master.listing_status = 403
    for i in range(3):
        master.drivers[f"driver-{i}"] = FakeDriver(finish_at=time.time() + 1)
    events = await asyncio.gather(*(_first_event(_trigger(f"driver-{i}")) for i in range(3)))
    assert [e["status"] for e in events] == ["success"] * 3, events
    assert _count(master, "/json/") >= 1
    assert _count(master, "/v1/submissions/status/") >= 3
    assert all(r.authorization is None for r in master.requests if r.path.startswith("/json/"))


@pytest.mark.parametrize("first", ["slow", "fast"])
async def test_the_shared_poller_runs_at_the_shortest_interval_among_its_watches(
    master: FakeSparkMaster, first: str
):
    """
    A 0.2 s trigger sharing the poller with a 600 s one is answered at 0.2 s, whichever came first.

    The recording master, because the test needs drivers that end on a schedule and a count of
    the listings the poller sent while both waited.
    """
    master.drivers["driver-slow"] = FakeDriver(state="RUNNING")
    master.drivers["driver-fast"] = FakeDriver(state="RUNNING")
    runs: dict[str, asyncio.Future[dict[str, Any]]] = {}

    def start(name: str, interval: float) -> None:
        runs[name] = asyncio.ensure_future(
            _first_event(_trigger(f"driver-{name}", poll_interval=interval), 600)
        )

    intervals = {"slow": 600.0, "fast": 0.2}
    order = [first, "fast" if first == "slow" else "slow"]
    start(order[0], intervals[order[0]])
    # The second trigger joins a poller that has already listed once (and, for the slow one
    # first, gone to sleep for its 600 s).
    await eventually(
        lambda: _count(master, "/json/"), lambda n: n >= 1, timeout=30, what="the poller's first listing"
    )
    start(order[1], intervals[order[1]])
    listed_before = _count(master, "/json/")
    master.drivers["driver-fast"].finish_at = time.time() + 1
    event = await asyncio.wait_for(runs["fast"], 60)
    assert event["status"] == "success", event
    # The listing that saw it finish came after the second trigger joined, not 600 s later.
    assert _count(master, "/json/") > listed_before
    assert not runs["slow"].done()
    runs["slow"].cancel()
    with pytest.raises(asyncio.CancelledError):
        await runs["slow"]
    assert not poller._POLLERS
