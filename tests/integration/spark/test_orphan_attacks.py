"""
Attacks on the orphan check (issue 46 item 9) against the recording master (loopback).

The orphan check reads each foreign driver's launch command from its *worker's* web UI. Worker
web UIs are often unreachable or slow from where the triggerers run (workers on a private
network, only the master's ports open, a worker host that is going away): these tests check
that the check never holds up the poller's own work, the watches of the triggers it serves.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from typing import Any

import pytest

from airflow_shared_stream.spark.triggers import SparkApplicationTrigger
from tests.support.fake_spark_master import FakeDriver, FakeSparkMaster, launch_command
from tests.support.waiting import eventually

pytestmark = pytest.mark.integration

TOKEN = "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJhaXJmbG93In0.orphan-attack-token"


@pytest.fixture
def master(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeSparkMaster]:
    with FakeSparkMaster(token=TOKEN) as server:
        # The web UI read of a slow worker takes as long as the connection's timeout lets it.
        monkeypatch.setenv("AIRFLOW_CONN_SPARK_ORPH", json.dumps(server.connection(**{"rest-timeout": 600})))
        yield server


class _Comms:
    """The triggerer's supervisor channel: answers every task-state question with ``state``."""

    def __init__(self, state: str | None) -> None:
        self.state = state
        self.asked: list[Any] = []

    async def asend(self, msg: Any) -> Any:
        from airflow.sdk.execution_time.comms import GetTaskStates, TaskStatesResult

        if not isinstance(msg, GetTaskStates):
            raise LookupError("only task states are answered here")
        self.asked.append(msg)
        states = {} if self.state is None else {"run-1": {"spark": self.state}}
        return TaskStatesResult(task_states=states)


_THIS_DEPLOYMENT = object()


def _started_for_task(state: str = "RUNNING", deployment: object = _THIS_DEPLOYMENT) -> FakeDriver:
    """A driver started by the operator; by default by this deployment (its identity in the property)."""
    from airflow_shared_stream.spark.task_states import (
        TASK_INSTANCE_PROPERTY,
        TaskInstanceRef,
        deployment_identity,
    )

    owner = deployment_identity() if deployment is _THIS_DEPLOYMENT else deployment
    assert owner is None or isinstance(owner, str)
    ref = TaskInstanceRef(dag_id="d", run_id="run-1", task_id="spark", deployment=owner)
    body = json.dumps({"sparkProperties": {TASK_INSTANCE_PROPERTY: ref.encode()}}).encode()
    return FakeDriver(state=state, stderr=launch_command(body))


async def _first_event(trigger: SparkApplicationTrigger) -> dict[str, Any]:
    async for event in trigger.run():
        return event.payload
    raise AssertionError("trigger ended without an event")


async def test_a_slow_worker_ui_never_holds_up_the_watches(
    master: FakeSparkMaster, monkeypatch: pytest.MonkeyPatch
):
    """
    FAULT_MODEL 13 (load) and 7 (liveness): a worker web UI that does not answer (a host going
    away, a firewall dropping packets, a worker under GC) must not delay what the poller exists
    for. A foreign driver (another triggerer's, named by ``spark.airflow.taskInstance``) runs on
    a worker whose UI holds the request; the watched driver then finishes. Its trigger must report
    it while the orphan check's read is still outstanding. With the check awaited inside the
    round (the first version), no listing was taken until the read timed out (``rest-timeout``,
    30 s by default, per batch of 16 drivers, again every 30 s while the worker stays slow), and
    the task's end waited for it.
    """
    from airflow.sdk.execution_time import task_runner

    monkeypatch.setattr(task_runner, "SUPERVISOR_COMMS", _Comms("deferred"), raising=False)
    master.drivers["driver-watched"] = _started_for_task()
    master.drivers["driver-foreign"] = _started_for_task()
    master.response_delay["/log/?driverId=driver-foreign"] = 600.0  # the worker UI hangs

    waiting = asyncio.ensure_future(
        _first_event(
            SparkApplicationTrigger(submission_id="driver-watched", conn_id="spark_orph", poll_interval=0.2)
        )
    )
    try:
        await eventually(
            lambda: [r.path for r in master.requests if r.path.startswith("/log/?driverId=driver-foreign")],
            bool,
            timeout=30,
            what="the orphan check reading the foreign driver's launch command",
        )
        master.drivers["driver-watched"].finish_at = time.time()
        # 20 s is 100 poll intervals: the listing after the driver's end settles it at once.
        done, _ = await asyncio.wait({waiting}, timeout=20)
        assert done, (
            "the watched driver FINISHED but its trigger reported nothing while the orphan check "
            "waited on another driver's worker UI"
        )
        assert waiting.result()["status"] == "success", waiting.result()
    finally:
        waiting.cancel()
        await asyncio.gather(waiting, return_exceptions=True)


class _RunGone(_Comms):
    """What the execution API answers for a task instance whose Dag run was deleted: nothing.

    ``GET /execution/task-instances/states`` builds ``{run_id: {task_id: state}}`` from the task
    instance rows it finds: a cleared task instance is there with ``None``; one whose run was
    deleted is absent, run id and all (``api_fastapi/execution_api/routes/task_instances.py``).
    """

    async def asend(self, msg: Any) -> Any:
        from airflow.sdk.execution_time.comms import GetTaskStates, TaskStatesResult

        if not isinstance(msg, GetTaskStates):
            raise LookupError("only task states are answered here")
        self.asked.append(msg)
        return TaskStatesResult(task_states={})


async def test_a_driver_whose_run_was_deleted_while_its_triggerer_was_dead_is_killed(
    master: FakeSparkMaster, monkeypatch: pytest.MonkeyPatch
):
    """
    FAULT_MODEL 3 (a triggerer killed) and 10: deleting a deferred task's Dag run is a user's
    stop, like marking it failed. With its triggerer alive, ``clean_unused`` cancels the trigger
    and ``on_kill`` reads the state as gone and kills the driver (docs/spark.rst: "any other
    state (failed, success, cleared, gone) means the user acted"). With that triggerer dead,
    nobody runs ``on_kill``, and the orphan check is the only one left: it must kill the driver
    of a task instance that no longer exists. Today ``task_instance_state`` folds "no such task
    instance" into ``None``, the cleared task's state, and the check keeps the driver for a next
    try that will never come; it runs until someone kills it by hand. The execution API tells
    the two apart (a cleared task instance is in the answer with no state; a deleted one is not).
    A driver of another deployment sharing the master (same Dag, run and task ids), or of
    unknown deployment (started before drivers carried one), is kept: its task may exist there.
    """
    from airflow.sdk.execution_time import task_runner

    comms = _RunGone(None)
    monkeypatch.setattr(task_runner, "SUPERVISOR_COMMS", comms, raising=False)
    master.drivers["driver-watched"] = _started_for_task()
    master.drivers["driver-of-deleted-run"] = _started_for_task()
    master.drivers["driver-of-another-deployment"] = _started_for_task(deployment="0123456789abcdef")
    master.drivers["driver-of-unknown-deployment"] = _started_for_task(deployment=None)
    waiting = asyncio.ensure_future(
        _first_event(
            SparkApplicationTrigger(submission_id="driver-watched", conn_id="spark_orph", poll_interval=0.2)
        )
    )
    try:
        from airflow_shared_stream.spark import poller

        await eventually(lambda: list(poller._POLLERS.values()), bool, timeout=30, what="the poller")
        (master_poller,) = poller._POLLERS.values()
        await eventually(
            lambda: master_poller.orphans.checks, lambda n: n >= 1, timeout=30, what="the orphan check"
        )
        assert comms.asked, "the check never asked for the task instance's state"
        assert master.drivers["driver-of-deleted-run"].state == "KILLED", (
            "the driver of a deleted Dag run's task runs on"
        )
        assert master.drivers["driver-watched"].state == "RUNNING"
        assert master.drivers["driver-of-another-deployment"].state == "RUNNING", (
            "a driver another Airflow sharing the master started was killed"
        )
        assert master.drivers["driver-of-unknown-deployment"].state == "RUNNING"
    finally:
        waiting.cancel()
        await asyncio.gather(waiting, return_exceptions=True)


async def test_the_orphan_check_never_sends_the_token_to_a_web_ui(
    master: FakeSparkMaster, monkeypatch: pytest.MonkeyPatch
):
    """
    FAULT_MODEL 12: the orphan check reads launch commands from worker web UIs (plain HTTP, not
    behind the JWS filter, their addresses taken from the master's listing) and kills over REST.
    Only the kill, sent to the REST server, may carry the token.
    """
    from airflow.sdk.execution_time import task_runner

    from airflow_shared_stream.spark import poller

    monkeypatch.setattr(task_runner, "SUPERVISOR_COMMS", _Comms("failed"), raising=False)
    master.drivers["driver-watched"] = FakeDriver(state="RUNNING")  # names no task instance
    master.drivers["driver-orphan"] = _started_for_task()
    waiting = asyncio.ensure_future(
        _first_event(
            SparkApplicationTrigger(submission_id="driver-watched", conn_id="spark_orph", poll_interval=0.2)
        )
    )
    try:
        await eventually(
            lambda: master.drivers["driver-orphan"].state,
            lambda s: s == "KILLED",
            timeout=30,
            what="the kill",
        )
        (master_poller,) = poller._POLLERS.values()
        assert master_poller.orphans.killed == ["driver-orphan"]
    finally:
        waiting.cancel()
        await asyncio.gather(waiting, return_exceptions=True)
    logs = [r for r in master.requests if r.path.startswith("/log/")]
    assert logs, "the check never read a launch command"
    for request in master.requests:
        if request.path.startswith("/v1/"):
            assert request.authorization == f"Bearer {TOKEN}", request
        else:
            assert request.authorization is None, f"the JWS token was sent to {request.path}"


async def test_a_driver_of_another_deployment_is_never_killed(
    master: FakeSparkMaster, monkeypatch: pytest.MonkeyPatch
):
    """
    Two Airflow deployments share the master, with a task of the same Dag, run and task ids: the
    task ended here, the other deployment's driver must run on (its own task may be running).
    """
    from airflow.sdk.execution_time import task_runner

    comms = _Comms("failed")
    monkeypatch.setattr(task_runner, "SUPERVISOR_COMMS", comms, raising=False)
    master.drivers["driver-watched"] = FakeDriver(state="RUNNING")
    master.drivers["driver-ours"] = _started_for_task()
    master.drivers["driver-of-another-deployment"] = _started_for_task(deployment="0123456789abcdef")
    waiting = asyncio.ensure_future(
        _first_event(
            SparkApplicationTrigger(submission_id="driver-watched", conn_id="spark_orph", poll_interval=0.2)
        )
    )
    try:
        from airflow_shared_stream.spark import poller

        await eventually(lambda: list(poller._POLLERS.values()), bool, timeout=30, what="the poller")
        (master_poller,) = poller._POLLERS.values()
        await eventually(
            lambda: master_poller.orphans.checks, lambda n: n >= 1, timeout=30, what="the orphan check"
        )
        assert master.drivers["driver-ours"].state == "KILLED"
        assert master.drivers["driver-of-another-deployment"].state == "RUNNING", (
            "a driver another Airflow sharing the master started was killed"
        )
        assert len(comms.asked) == 1, "asked about another deployment's task instance"
    finally:
        waiting.cancel()
        await asyncio.gather(waiting, return_exceptions=True)


def test_the_operator_names_this_deployment_in_its_drivers_launch_command(master: FakeSparkMaster) -> None:
    """
    Issue 46 item 9: what the orphan check reads back from a driver the operator started is its
    task instance and this deployment's identity (a digest of ``[api] secret_key``, never the key).
    """
    from types import SimpleNamespace

    from airflow.configuration import conf
    from airflow.sdk.exceptions import TaskDeferred

    from airflow_shared_stream.spark.operators import DeferrableSparkSubmitOperator
    from airflow_shared_stream.spark.task_states import (
        TaskInstanceRef,
        deployment_identity,
        task_instance_in_launch_command,
    )
    from tests.support.spark import MemoryTaskStateStore

    ti = SimpleNamespace(dag_id="d", run_id="run-1", task_id="spark", map_index=-1)
    op = DeferrableSparkSubmitOperator(
        task_id="spark", conn_id="spark_orph", application="/jobs/app.py", deferrable=True
    )
    with pytest.raises(TaskDeferred):
        op.execute({"task_state_store": MemoryTaskStateStore(), "ti": ti})
    (driver,) = master.drivers.values()
    assert deployment_identity()
    assert task_instance_in_launch_command(driver.stderr) == TaskInstanceRef(
        dag_id="d", run_id="run-1", task_id="spark", deployment=deployment_identity()
    )
    assert conf.get("api", "secret_key") not in driver.stderr
