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


class _TriggererComms:
    """
    Stands in for the triggerer's supervisor channel (``SUPERVISOR_COMMS``) that ``on_kill`` asks.

    The real one is exercised by test_trigger_moves.py with two triggerers; this covers every
    task state (a user marking the task failed or success, clearing it, deleting its run) and an
    unanswerable channel, which that test cannot reach.
    """

    def __init__(self, state: str | None, *, fails: bool = False, delay: float = 0.0) -> None:
        self.state, self.fails, self.delay = state, fails, delay
        self.asked: list[Any] = []

    async def asend(self, msg: Any) -> Any:
        from airflow.sdk.execution_time.comms import GetTaskStates, TaskStatesResult

        if not isinstance(msg, GetTaskStates):
            # The connection lookup asks here first; the environment variable answers instead.
            raise LookupError("only task states are answered here")
        self.asked.append(msg)
        await asyncio.sleep(self.delay)
        if self.fails:
            raise ConnectionResetError("supervisor gone")
        states = {} if self.state is None else {"run-1": {"spark": self.state}}
        return TaskStatesResult(task_states=states)


@pytest.mark.parametrize(
    ("task_state", "killed"),
    [
        ("deferred", False),  # the trigger moved: another triggerer waits on the driver
        ("failed", True),  # marked failed
        ("success", True),  # marked success
        ("scheduled", True),  # cleared and already picked up again
        (None, True),  # cleared, or the run deleted
        ("<comms fail>", False),  # cannot tell: a move must never kill
    ],
)
async def test_on_kill_kills_only_when_the_task_is_no_longer_deferred(
    master: FakeSparkMaster, monkeypatch: pytest.MonkeyPatch, task_state: str | None, killed: bool
):
    from types import SimpleNamespace

    from airflow.sdk.execution_time import task_runner

    master.drivers["driver-1"] = FakeDriver(state="RUNNING")
    comms = _TriggererComms(task_state, fails=task_state == "<comms fail>")
    monkeypatch.setattr(task_runner, "SUPERVISOR_COMMS", comms, raising=False)
    trigger = _trigger("driver-1")
    trigger.task_instance = SimpleNamespace(dag_id="d", run_id="run-1", task_id="spark", map_index=-1)
    await asyncio.wait_for(trigger.on_kill(), 60)
    assert master.drivers["driver-1"].state == ("KILLED" if killed else "RUNNING")
    (asked,) = comms.asked
    assert (asked.dag_id, asked.run_ids, asked.task_ids, asked.map_index) == ("d", ["run-1"], ["spark"], -1)


@pytest.mark.parametrize("choice", ["fail", "resubmit"])
def test_an_unanswered_create_without_master_ui_is_resubmitted_only_by_choice(
    master: FakeSparkMaster, monkeypatch: pytest.MonkeyPatch, choice: str
):
    """
    Without master-ui-url an earlier attempt's unanswered create cannot be looked up.

    The recording master, because the lost answer must be staged: the store holds the marker an
    attempt writes before a create whose answer never came.
    """
    from airflow.sdk.exceptions import AirflowFailException, TaskDeferred

    from airflow_shared_stream.spark.operators import DeferrableSparkSubmitOperator
    from tests.support.spark import MemoryTaskStateStore

    conn = master.connection()
    conn["extra"].pop("master-ui-url")  # type: ignore[attr-defined]
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_REC_NO_UI", json.dumps(conn))
    store = MemoryTaskStateStore()
    store.set("spark_job_id_pending", {"tag": "lost-answer", "since": time.time()})
    op = DeferrableSparkSubmitOperator(
        task_id="spark",
        conn_id="spark_rec_no_ui",
        application="/jobs/app.py",
        deferrable=True,
        on_unknown_outcome=choice,
    )
    if choice == "fail":
        with pytest.raises(AirflowFailException, match="whether the application started is unknown"):
            op.execute({"task_state_store": store})
        assert _count(master, "/v1/submissions/create") == 0
        assert store.get("spark_job_id_pending"), "the marker must stay: every retry decides the same"
    else:
        with pytest.raises(TaskDeferred):
            op.execute({"task_state_store": store})
        assert _count(master, "/v1/submissions/create") == 1


async def test_on_kill_finishes_the_kill_when_the_triggerer_cancels_it_again(
    master: FakeSparkMaster, monkeypatch: pytest.MonkeyPatch
):
    """
    Airflow 3.3.2 repeats the cancel with every state sync until the trigger has ended.

    Seen with two real triggerers: a task marked failed, on_kill cut off after asking for the
    state, the driver left running. Here the repeated cancel lands while on_kill waits for the
    state (the stand-in answers after 0.5 s).
    """
    from types import SimpleNamespace

    from airflow.sdk.execution_time import task_runner

    master.drivers["driver-1"] = FakeDriver(state="RUNNING")
    comms = _TriggererComms("failed", delay=0.5)
    monkeypatch.setattr(task_runner, "SUPERVISOR_COMMS", comms, raising=False)
    trigger = _trigger("driver-1")
    trigger.task_instance = SimpleNamespace(dag_id="d", run_id="run-1", task_id="spark", map_index=-1)
    on_kill = asyncio.ensure_future(trigger.on_kill())
    await eventually(
        lambda: len(comms.asked), lambda n: n == 1, timeout=30, what="on_kill to ask for the state"
    )
    on_kill.cancel("__airflow_user_action__")
    with pytest.raises(asyncio.CancelledError):
        await on_kill
    await eventually(
        lambda: master.drivers["driver-1"].state, lambda s: s == "KILLED", timeout=30, what="the kill"
    )


@pytest.mark.parametrize(
    ("task_state", "killed"),
    [
        ("failed", True),  # marked failed while its triggerer was dead: no trigger left
        ("success", True),
        ("deferred", False),  # its trigger runs on another triggerer (or is moving there)
        ("running", False),  # a try is reattaching to it, or resuming
        ("up_for_retry", False),  # the retry reattaches to it
        (None, False),  # cleared: the next try reattaches to it
        ("<comms fail>", False),  # cannot tell
    ],
)
async def test_a_poller_kills_another_driver_only_once_its_task_has_ended(
    master: FakeSparkMaster, monkeypatch: pytest.MonkeyPatch, task_state: str | None, killed: bool
):
    """
    The orphan check (issue 46): every state a task instance can be in while its driver runs on
    a master that another triggerer's poller lists. The end-to-end case is test_orphaned_driver.py.
    """
    from airflow.sdk.execution_time import task_runner

    from airflow_shared_stream.spark.task_states import TASK_INSTANCE_PROPERTY, TaskInstanceRef
    from tests.support.fake_spark_master import launch_command

    def started_with(properties: dict[str, str]) -> FakeDriver:
        return FakeDriver(
            state="RUNNING", stderr=launch_command(json.dumps({"sparkProperties": properties}).encode())
        )

    ref = TaskInstanceRef(dag_id="d", run_id="run-1", task_id="spark")
    master.drivers["driver-watched"] = started_with({TASK_INSTANCE_PROPERTY: ref.encode()})
    master.drivers["driver-other"] = started_with({TASK_INSTANCE_PROPERTY: ref.encode()})
    master.drivers["driver-not-airflow"] = started_with({"spark.app.name": "by hand"})
    comms = _TriggererComms(task_state, fails=task_state == "<comms fail>")
    monkeypatch.setattr(task_runner, "SUPERVISOR_COMMS", comms, raising=False)
    waiting = asyncio.ensure_future(_first_event(_trigger("driver-watched"), 120))
    await eventually(lambda: len(comms.asked), lambda n: n >= 1, timeout=30, what="the orphan check")
    (master_poller,) = poller._POLLERS.values()
    await eventually(
        lambda: master_poller.orphans.checks, lambda n: n >= 1, timeout=30, what="the check's end"
    )
    assert master.drivers["driver-other"].state == ("KILLED" if killed else "RUNNING")
    assert master.drivers["driver-watched"].state == "RUNNING", "its own watch's driver is the trigger's"
    assert master.drivers["driver-not-airflow"].state == "RUNNING"
    assert [(m.dag_id, m.run_ids, m.task_ids, m.map_index) for m in comms.asked] == [
        ("d", ["run-1"], ["spark"], -1)
    ], "asked once per check, and only about the driver that names a task instance"
    assert not waiting.done()
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
