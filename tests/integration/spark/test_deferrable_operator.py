"""The deferrable operator and its trigger against a real, JWS-protected standalone cluster."""

from __future__ import annotations

import asyncio
import datetime as dt
import importlib
import json
import time
from pathlib import Path
from typing import Any

import pyarrow.dataset as ds
import pytest
from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator
from airflow.sdk.exceptions import AirflowException, AirflowTaskTimeout, TaskDeferred

from airflow_shared_stream.spark import poller
from airflow_shared_stream.spark.operators import DeferrableSparkSubmitOperator
from airflow_shared_stream.spark.triggers import SparkApplicationTrigger
from tests.integration.spark.conftest import APPS
from tests.support.flaky_proxy import FlakyProxy
from tests.support.spark import MemoryTaskStateStore, SparkCluster, pid_alive
from tests.support.waiting import eventually

pytestmark = pytest.mark.integration

EVENTS_JOB = Path(__file__).parents[3] / "example_dags" / "spark_jobs" / "events_to_parquet.py"
SMALL = {"spark.ui.enabled": "false", "spark.sql.shuffle.partitions": "2", "spark.driver.memory": "512m"}


def _operator(conn_id: str, **kwargs: Any) -> DeferrableSparkSubmitOperator:
    kwargs.setdefault("deferrable", True)
    kwargs.setdefault("conf", dict(SMALL))
    return DeferrableSparkSubmitOperator(task_id=kwargs.pop("task_id", "spark"), conn_id=conn_id, **kwargs)


def _defer(op: DeferrableSparkSubmitOperator, context: dict[str, Any]) -> SparkApplicationTrigger:
    with pytest.raises(TaskDeferred) as deferred:
        op.execute(context)
    trigger = deferred.value.trigger
    assert isinstance(trigger, SparkApplicationTrigger)
    assert deferred.value.method_name == "execute_complete"
    # Rebuild it the way the triggerer does: from serialize() only.
    classpath, kwargs = trigger.serialize()
    module, _, name = classpath.rpartition(".")
    return getattr(importlib.import_module(module), name)(**kwargs)


async def _first_event(trigger: SparkApplicationTrigger, timeout: float = 120) -> dict[str, Any]:
    async def first() -> dict[str, Any]:
        async for event in trigger.run():
            return event.payload
        raise AssertionError("trigger ended without an event")

    return await asyncio.wait_for(first(), timeout)


def _wait_for_file(path: Path, timeout: float) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists():
            return path.read_text()
        time.sleep(0.2)
    raise AssertionError(f"{path} did not appear within {timeout}s")


def _wait_pid_gone(pid: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not pid_alive(pid):
            return True
        time.sleep(0.2)
    return False


def _drivers(cluster: SparkCluster) -> dict[str, str]:
    state = cluster.master_state()
    return {d["id"]: d["state"] for d in state.get("activedrivers", []) + state.get("completeddrivers", [])}


def _read_parquet(path: Path) -> list[dict[str, Any]]:
    table = ds.dataset(str(path), format="parquet", partitioning="hive").to_table()
    rows = table.to_pylist()
    return sorted(rows, key=lambda r: (str(r["event_date"]), r["type"]))


RECORDS = [
    {"id": "o-1", "ts": "2026-11-20T10:00:00Z", "type": "order", "amount": 10.5, "customer": "c1"},
    {"id": "o-1", "ts": "2026-11-20T10:00:00Z", "type": "order", "amount": 10.5, "customer": "c1"},
    {"id": "o-2", "ts": "2026-11-20T23:59:59Z", "type": "order", "amount": 2, "customer": "c2"},
    {"id": "r-1", "ts": "2026-11-21T08:30:00Z", "type": "refund", "amount": 3, "customer": "c1"},
    {"id": "bad", "ts": "yesterday", "type": "order", "amount": 1},
]


async def test_submit_defer_and_finish_writes_parquet(spark_cluster, spark_conn_id, tmp_path):
    store = MemoryTaskStateStore()
    out = tmp_path / "daily"
    op = _operator(
        spark_conn_id,
        application=str(EVENTS_JOB),
        application_args=["--records", json.dumps(RECORDS), "--output", str(out), "--batch-id", "b1"],
        name="events-to-parquet-it",
    )
    trigger = _defer(op, {"task_state_store": store})
    assert store.get(op.external_id_key) == trigger.submission_id
    assert trigger.conn_id == spark_conn_id

    event = await _first_event(trigger, timeout=240)
    log = spark_cluster.driver_log(trigger.submission_id)
    assert event["status"] == "success", f"{event}\n{log}"
    assert event["driver_state"] == "FINISHED"
    op.execute_complete({}, event)

    rows = _read_parquet(out)
    assert [(str(r["event_date"]), r["type"], r["events"], r["amount"], r["customers"]) for r in rows] == [
        ("2026-11-20", "order", 2, 12.5, 2),
        ("2026-11-21", "refund", 1, 3.0, 1),
    ]
    assert {r["batch_id"] for r in rows} == {"b1"}
    summary = json.loads([ln for ln in log.splitlines() if ln.startswith("{")][-1])
    assert summary == {
        "records": 5,
        "valid": 4,
        "invalid": 1,
        "duplicates": 1,
        "rows_written": 2,
        "batch_id": "b1",
    }


async def test_failed_application_fails_the_task_with_the_drivers_message(spark_cluster, spark_conn_id):
    op = _operator(spark_conn_id, application=str(APPS / "fails.py"), application_args=["42"])
    trigger = _defer(op, {"task_state_store": MemoryTaskStateStore()})
    event = await _first_event(trigger)
    assert event["status"] == "failed", event
    assert event["driver_state"] == "FAILED"
    assert "RuntimeError: input batch 42 is corrupt" in event["message"], event
    with pytest.raises(AirflowException, match="input batch 42 is corrupt"):
        op.execute_complete({}, event)


async def test_unknown_submission_is_an_error_not_an_endless_poll(spark_cluster, spark_conn_id):
    trigger = SparkApplicationTrigger(
        submission_id="driver-20000101000000-9999", conn_id=spark_conn_id, poll_interval=0.2
    )
    started = time.monotonic()
    event = await _first_event(trigger, timeout=30)
    assert time.monotonic() - started < 10
    assert event["status"] == "error"
    assert "does not know submission driver-20000101000000-9999" in event["message"]
    with pytest.raises(AirflowException, match="does not know submission"):
        _operator(spark_conn_id, application="x.py").execute_complete({}, event)


async def test_deadline_kills_the_driver_and_its_python_process(spark_cluster, spark_conn_id, tmp_path):
    pid_file = tmp_path / "driver.pid"
    op = _operator(
        spark_conn_id,
        application=str(APPS / "sleeper.py"),
        application_args=[str(pid_file)],
        execution_timeout=dt.timedelta(seconds=30),
    )
    trigger = _defer(op, {"task_state_store": MemoryTaskStateStore()})
    assert trigger.deadline is not None
    run = asyncio.ensure_future(_first_event(trigger))
    pid = int((await asyncio.to_thread(_wait_for_file, pid_file, 28)).split()[0])
    assert pid_alive(pid)
    assert not run.done(), "the trigger ended before its deadline"

    event = await asyncio.wait_for(run, 90)
    assert event["status"] == "timeout", event
    assert event["driver_state"] == "KILLED", event
    assert time.time() >= trigger.deadline
    assert _drivers(spark_cluster)[trigger.submission_id] == "KILLED"
    assert await asyncio.to_thread(_wait_pid_gone, pid, 15), f"driver python {pid} outlived the kill"
    with pytest.raises(AirflowTaskTimeout, match="execution_timeout"):
        op.execute_complete({}, event)


async def test_on_kill_kills_the_driver(spark_cluster, spark_conn_id, tmp_path):
    pid_file = tmp_path / "driver.pid"
    op = _operator(spark_conn_id, application=str(APPS / "sleeper.py"), application_args=[str(pid_file)])
    trigger = _defer(op, {"task_state_store": MemoryTaskStateStore()})
    run = asyncio.ensure_future(_first_event(trigger))
    pid = int((await asyncio.to_thread(_wait_for_file, pid_file, 60)).split()[0])

    # What the triggerer does on a user action: cancel run(), then await on_kill().
    run.cancel()
    with pytest.raises(asyncio.CancelledError):
        await run
    await asyncio.wait_for(trigger.on_kill(), 40)
    assert _drivers(spark_cluster)[trigger.submission_id] == "KILLED"
    assert await asyncio.to_thread(_wait_pid_gone, pid, 15), f"driver python {pid} outlived the kill"


async def test_retry_reattaches_to_the_running_driver(spark_cluster, spark_conn_id, tmp_path):
    store = MemoryTaskStateStore()
    pid_file = tmp_path / "driver.pid"
    kwargs = {"application": str(APPS / "sleeper.py"), "application_args": [str(pid_file), "20"]}
    first = _defer(_operator(spark_conn_id, **kwargs), {"task_state_store": store})
    before = set(_drivers(spark_cluster))

    # The retry is a fresh operator instance (a new worker process) with the same task state.
    retry_op = _operator(spark_conn_id, **kwargs)
    second = _defer(retry_op, {"task_state_store": store})
    assert second.submission_id == first.submission_id
    assert set(_drivers(spark_cluster)) == before, "the retry submitted a second driver"

    event = await _first_event(second)
    assert event["status"] == "success", event
    # A retry after success neither resubmits nor defers: the work is done.
    assert _operator(spark_conn_id, **kwargs).execute({"task_state_store": store}) is None
    assert set(_drivers(spark_cluster)) == before


async def test_retry_after_failure_submits_anew(spark_cluster, spark_conn_id):
    store = MemoryTaskStateStore()
    kwargs = {"application": str(APPS / "fails.py"), "application_args": ["7"]}
    first = _defer(_operator(spark_conn_id, **kwargs), {"task_state_store": store})
    assert (await _first_event(first))["status"] == "failed"
    second = _defer(_operator(spark_conn_id, **kwargs), {"task_state_store": store})
    assert second.submission_id != first.submission_id
    assert store.get("spark_job_id") == second.submission_id
    assert (await _first_event(second))["status"] == "failed"


def test_token_stays_out_of_serialize_and_errors(spark_cluster, spark_conn_id):
    trigger = SparkApplicationTrigger(submission_id="driver-x", conn_id=spark_conn_id)
    assert spark_cluster.token not in json.dumps(trigger.serialize())
    op = _operator(spark_conn_id, application=str(APPS / "hello.py"), application_args=["/dev/null"])
    assert spark_cluster.token not in repr(op.__dict__)


async def test_bad_token_is_refused_without_echoing_it(spark_cluster, spark_conn_id, monkeypatch):
    bad_token = "not-a-valid-jws-but-secret-looking-0123456789"
    conn = spark_cluster.connection()
    conn["password"] = bad_token
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_IT_BAD", json.dumps(conn))
    event = await _first_event(SparkApplicationTrigger(submission_id="driver-x", conn_id="spark_it_bad"))
    assert event["status"] == "error"
    assert "HTTP 403" in event["message"]
    assert bad_token not in json.dumps(event)
    op = _operator("spark_it_bad", application=str(APPS / "hello.py"), application_args=["/dev/null"])
    with pytest.raises(Exception, match="403") as refused:
        op.execute({"task_state_store": MemoryTaskStateStore()})
    assert bad_token not in str(refused.value)


async def test_transient_errors_are_tolerated_then_give_up(
    spark_cluster, spark_conn_id, tmp_path, monkeypatch
):

    marker = tmp_path / "hello.txt"
    op = _operator(spark_conn_id, application=str(APPS / "hello.py"), application_args=[str(marker)])
    trigger = _defer(op, {"task_state_store": MemoryTaskStateStore()})
    with FlakyProxy(spark_cluster.rest_port, fail_first=3) as proxy:
        conn = spark_cluster.connection(**{"rest-port": proxy.port})
        monkeypatch.setenv("AIRFLOW_CONN_SPARK_IT_FLAKY", json.dumps(conn))
        tolerant = SparkApplicationTrigger(
            submission_id=trigger.submission_id,
            conn_id="spark_it_flaky",
            poll_interval=0.2,
            max_transient_errors=3,
        )
        event = await _first_event(tolerant)
        assert event["status"] == "success", event
        assert proxy.failed == 3
        assert marker.read_text() == "hello from the driver\n"

    with FlakyProxy(spark_cluster.rest_port, fail_first=100) as proxy:
        monkeypatch.setenv(
            "AIRFLOW_CONN_SPARK_IT_FLAKY", json.dumps(spark_cluster.connection(**{"rest-port": proxy.port}))
        )
        strict = SparkApplicationTrigger(
            submission_id=trigger.submission_id,
            conn_id="spark_it_flaky",
            poll_interval=0.1,
            max_transient_errors=2,
        )
        event = await _first_event(strict)
        assert event["status"] == "error"
        assert "3 transient errors in a row" in event["message"]
        assert proxy.failed == 3


def test_not_deferrable_path_is_spark_submit_operator(spark_local_conn_id, tmp_path):
    """Local master: deferrable=True falls back to SparkSubmitOperator.execute (spark-submit)."""
    out = tmp_path / "local"
    kwargs = {
        "conn_id": spark_local_conn_id,
        "application": str(EVENTS_JOB),
        "application_args": ["--records", json.dumps(RECORDS), "--output", str(out), "--batch-id", "local"],
        "conf": dict(SMALL),
    }
    ours = DeferrableSparkSubmitOperator(task_id="ours", deferrable=True, **kwargs)
    stock = SparkSubmitOperator(task_id="stock", **kwargs)
    # The same spark-submit command line as the stock operator...
    app = kwargs["application"]
    command = ours._get_hook()._build_spark_submit_command(app)
    assert command == stock._get_hook()._build_spark_submit_command(app)
    assert command[:3] == ["spark-submit", "--master", "local[2]"]
    # ...run to completion on the worker: no TaskDeferred, and the job's real output.
    assert ours.execute({}) is None
    rows = _read_parquet(out)
    assert [(str(r["event_date"]), r["type"], r["events"], r["amount"]) for r in rows] == [
        ("2026-11-20", "order", 2, 12.5),
        ("2026-11-21", "refund", 1, 3.0),
    ]


async def test_driver_finishing_just_before_the_deadline_is_a_success(spark_cluster, spark_conn_id, tmp_path):
    """The deadline check must not report a timeout for a driver that already FINISHED."""
    marker = tmp_path / "hello.txt"
    op = _operator(spark_conn_id, application=str(APPS / "hello.py"), application_args=[str(marker)])
    submitted = _defer(op, {"task_state_store": MemoryTaskStateStore()})
    # One status request at once (driver still starting), the next one only at the deadline:
    # by then the driver has finished, and it finished before the deadline.
    deadline = time.time() + 25
    trigger = SparkApplicationTrigger(
        submission_id=submitted.submission_id, conn_id=spark_conn_id, poll_interval=600, deadline=deadline
    )
    run = asyncio.ensure_future(_first_event(trigger, timeout=90))
    await asyncio.to_thread(_wait_for_file, marker, 24)
    finished = await eventually(
        lambda: _drivers(spark_cluster)[submitted.submission_id],
        lambda state: state == "FINISHED",
        timeout=max(0.1, deadline - time.time() - 1),
        what="the driver to finish before the deadline",
    )
    assert finished == "FINISHED"
    assert time.time() < deadline
    event = await run
    assert event["status"] == "success", event
    assert event["driver_state"] == "FINISHED"
    op.execute_complete({}, event)


@pytest.mark.parametrize("found_by", ["the same attempt", "the retry"])
async def test_create_that_times_out_after_the_master_accepted_it_is_not_submitted_twice(
    spark_cluster, spark_conn_id, tmp_path, monkeypatch, found_by
):
    """
    An unanswered create's driver is found, not submitted again.

    With the master's web UI in the connection the attempt itself finds it; without, the
    attempt fails and the retry (whose connection has it) finds it from the pending marker.
    """
    store = MemoryTaskStateStore()
    pid_file = tmp_path / "driver.pid"
    kwargs = {
        "application": str(APPS / "sleeper.py"),
        "application_args": [str(pid_file), "15"],
        "name": f"idempotent-{tmp_path.name}",
    }
    before = set(_drivers(spark_cluster))
    with FlakyProxy(spark_cluster.rest_port, slow_answers={"/v1/submissions/create": 8}) as proxy:
        ui = {"master-ui-url": f"http://127.0.0.1:{spark_cluster.master_ui_port}"}
        conn = spark_cluster.connection(
            **{"rest-port": proxy.port, "rest-timeout": 3, **(ui if found_by == "the same attempt" else {})}
        )
        monkeypatch.setenv("AIRFLOW_CONN_SPARK_IT_SLOW", json.dumps(conn))
        first_attempt = _operator("spark_it_slow", **kwargs)
        failure = ""
        try:
            first = _defer(first_attempt, {"task_state_store": store})
        except Exception as exc:  # the attempt may fail: the task is then retried
            failure, first = str(exc), None
    assert spark_cluster.token not in failure
    if found_by == "the same attempt":
        assert first is not None, failure
    else:
        assert first is None
        assert store.get("spark_job_id_pending"), "the unanswered create left no marker"
    created = set(_drivers(spark_cluster)) - before
    assert len(created) == 1, f"the master should have started exactly one driver: {created}"
    (driver_id,) = created

    # The retry: a new worker process, the same task state, the master answering normally.
    retry = _defer(_operator(spark_conn_id, **kwargs), {"task_state_store": store})
    assert retry.submission_id == driver_id
    if first is not None:
        assert first.submission_id == driver_id
    assert not store.get("spark_job_id_pending")
    assert set(_drivers(spark_cluster)) - before == {driver_id}, "the retry submitted the application twice"
    event = await _first_event(retry)
    assert event["status"] == "success", event


async def test_triggers_on_one_master_share_one_poller(spark_cluster, spark_conn_id, tmp_path, monkeypatch):
    """A finishing, a failing and an unknown driver, waited on together through one listing loop."""
    # Which poller each trigger registered with, recorded as it registers: a peak of ``watching``
    # sampled every 20 ms missed the unknown driver, answered in the poller's first round, under
    # the full suite's load (2 of 3 seen at once).
    registered: list[int] = []
    original_watch = poller.watch

    def recording_watch(*args: Any, **kwargs: Any) -> Any:
        watch = original_watch(*args, **kwargs)
        registered.append(id(watch.poller))
        return watch

    monkeypatch.setattr(poller, "watch", recording_watch)
    store = MemoryTaskStateStore
    ok = _defer(
        _operator(spark_conn_id, application=str(APPS / "hello.py"), application_args=[str(tmp_path / "h")]),
        {"task_state_store": store()},
    )
    bad = _defer(
        _operator(spark_conn_id, application=str(APPS / "fails.py"), application_args=["5"]),
        {"task_state_store": store()},
    )
    unknown = SparkApplicationTrigger(submission_id="driver-20000101000000-0042", conn_id=spark_conn_id)
    runs = [asyncio.ensure_future(_first_event(t)) for t in (ok, bad, unknown)]
    seen: dict[int, poller.SparkMasterPoller] = {}
    while not all(r.done() for r in runs):
        for p in poller._POLLERS.values():
            seen[id(p)] = p
        await asyncio.sleep(0.02)
    assert len(registered) == 3, registered
    assert len(set(registered)) == 1, "the three triggers should share one poller"
    assert len(seen) == 1
    (shared,) = seen.values()
    assert id(shared) == registered[0]
    events = await asyncio.gather(*runs)
    assert [e["status"] for e in events] == ["success", "failed", "error"], events
    assert "input batch 5 is corrupt" in events[1]["message"]
    assert "does not know submission driver-20000101000000-0042" in events[2]["message"]
    # Status requests went only to what the listing could not settle: the unknown id.
    assert shared.status_requests >= 1
    assert shared.listings >= 1
    assert not poller._POLLERS


@pytest.mark.parametrize(
    "where",
    [
        {"application": "hdfs://namenode:8020/jobs/hello.py"},
        {"application": "s3a://jobs/hello.py"},
        {"application": str(APPS / "hello.py"), "py_files": "s3a://jobs/deps.zip"},
    ],
    ids=["hdfs application", "s3a application", "s3a py_files"],
)
def test_python_files_the_cluster_cannot_read_are_refused_at_submit(spark_cluster, spark_conn_id, where):
    """
    PythonRunner reads only local files: a remote script would start a driver that fails.

    Refused before anything reaches the master, with an error that says what to do.
    """
    before = set(_drivers(spark_cluster))
    store = MemoryTaskStateStore()
    op = _operator(spark_conn_id, application_args=["/dev/null"], **where)
    with pytest.raises(ValueError, match="only local files") as refused:
        op.execute({"task_state_store": store})
    assert "same path on every" in str(refused.value)
    assert set(_drivers(spark_cluster)) == before, "a driver was started for a file it cannot read"
    assert not store.values
