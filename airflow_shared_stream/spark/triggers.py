"""
``SparkApplicationTrigger``: wait in the triggerer for a standalone Spark driver to end.

Why a trigger: a Spark application runs for minutes to hours. ``SparkSubmitOperator`` holds a
worker slot (and a ``spark-submit`` JVM) all that time; the deferrable operator submits over
the master's REST API, hands the submission id to this trigger and frees the slot.

How it waits: by default through the master's shared poller
(:mod:`airflow_shared_stream.spark.poller`): one driver listing per interval for every trigger
waiting on that master, REST status only for drivers the listing does not settle. Without the
master's web UI in the connection (``master-ui-url``), or with ``shared_poller=False``, it polls
``GET /v1/submissions/status/<id>`` for its own driver (the per-trigger path).

What it promises, each because a naive poller got it wrong:

* **It always ends.** An unknown submission id (the master restarted, or the id is wrong) is
  an error event at once, not a poll that never returns; a run of transient errors (master
  unreachable, HTTP 5xx, master recovering) longer than ``max_transient_errors`` is an error.
* **It owns the deadline.** A deferred task is not covered by ``execution_timeout``, so the
  operator passes the attempt's deadline; past it the trigger asks for the driver's status once
  more (a driver that finished since the last poll is reported as what it is, not as a
  timeout), then kills it and reports ``timeout``. Killing matters: failing the task while
  Spark keeps running would let a retry run two copies of the job side by side.
* **on_kill kills only for a user.** When a user marks the deferred task failed/success or
  clears it, Airflow calls :meth:`on_kill` and the driver is killed. Airflow 3.3 also calls it
  for a trigger that moved to another triggerer; then the task is still deferred and the
  driver keeps running (:meth:`on_kill` asks for the task instance's state first).
* **No secret in kwargs.** ``serialize()`` holds the connection id, never the token: the
  trigger reads the connection in the triggerer.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from typing import Any

from airflow.triggers.base import BaseTrigger, TriggerEvent

from airflow_shared_stream.spark import poller
from airflow_shared_stream.spark.clients import AsyncSparkRestClient
from airflow_shared_stream.spark.config import SparkRestConfig
from airflow_shared_stream.spark.errors import SparkRestError, TransientSparkRestError, UnknownSubmissionError
from airflow_shared_stream.spark.hook import SparkRestHook
from airflow_shared_stream.spark.rest import ACTIVE_STATES, DriverStatus
from airflow_shared_stream.spark.task_states import UNREADABLE as _UNREADABLE
from airflow_shared_stream.spark.task_states import TaskInstanceRef, task_instance_state

DEFAULT_MAX_TRANSIENT_ERRORS = 5
KILL_CONFIRM_SECONDS = 30.0
"""After a kill, how long to wait for the master to report the driver KILLED."""
_ON_KILL_TASKS: set[asyncio.Task[None]] = set()
"""``on_kill`` work in flight (referenced so a cancelled ``on_kill`` does not let it be collected)."""


class SparkApplicationTrigger(BaseTrigger):
    """
    Poll a standalone Spark driver until it ends, the deadline passes, or errors persist.

    Fires exactly one event whose payload is ``{"status", "submission_id", "driver_state",
    "message"}`` with status ``success`` (FINISHED), ``failed`` (FAILED, ERROR, KILLED),
    ``timeout`` (deadline passed, driver killed) or ``error`` (unknown submission, persistent
    transport errors, auth refused).

    :param submission_id: the driver id returned by ``/v1/submissions/create``.
    :param conn_id: the ``spark`` connection (REST address and JWS token are read from it here).
    :param poll_interval: seconds between status requests.
    :param deadline: Unix time after which the driver is killed, or ``None`` for no deadline.
    :param max_transient_errors: consecutive transient failures tolerated before giving up.
    :param shared_poller: wait through the master's shared poller (one listing request per
        interval for all triggers on that master) when the connection has ``master-ui-url``;
        ``False`` polls this driver's REST status alone.
    """

    def __init__(
        self,
        *,
        submission_id: str,
        conn_id: str = "spark_default",
        poll_interval: float = 5.0,
        deadline: float | None = None,
        max_transient_errors: int = DEFAULT_MAX_TRANSIENT_ERRORS,
        shared_poller: bool = True,
    ) -> None:
        super().__init__()
        if poll_interval <= 0:
            raise ValueError("poll_interval must be positive")
        if max_transient_errors < 0:
            raise ValueError("max_transient_errors must be >= 0")
        self.submission_id = submission_id
        self.conn_id = conn_id
        self.poll_interval = float(poll_interval)
        self.deadline = None if deadline is None else float(deadline)
        self.max_transient_errors = int(max_transient_errors)
        self.shared_poller = bool(shared_poller)

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (
            f"{type(self).__module__}.{type(self).__qualname__}",
            {
                "submission_id": self.submission_id,
                "conn_id": self.conn_id,
                "poll_interval": self.poll_interval,
                "deadline": self.deadline,
                "max_transient_errors": self.max_transient_errors,
                "shared_poller": self.shared_poller,
            },
        )

    async def _config(self) -> SparkRestConfig:
        return await SparkRestHook(self.conn_id).aget_config()

    def _event(self, status: str, driver_state: str | None, message: str) -> TriggerEvent:
        return TriggerEvent(
            {
                "status": status,
                "submission_id": self.submission_id,
                "driver_state": driver_state,
                "message": message,
            }
        )

    async def run(self) -> AsyncIterator[TriggerEvent]:
        try:
            cfg = await self._config()
        except Exception as exc:
            # Connection lookup errors name the conn id only; never the password.
            yield self._event("error", None, f"cannot read connection {self.conn_id!r}: {type(exc).__name__}")
            return
        if self.shared_poller and cfg.master_ui_url:
            event = await self._wait_shared(cfg)
        else:
            async with AsyncSparkRestClient(cfg) as client:
                event = await self._poll(client)
        yield event

    async def _wait_shared(self, cfg: SparkRestConfig) -> TriggerEvent:
        """Wait on the master's shared poller; this trigger keeps its deadline and error rules."""
        watch = poller.watch(
            cfg,
            self.submission_id,
            poll_interval=self.poll_interval,
            max_transient_errors=self.max_transient_errors,
        )
        try:
            timeout = None if self.deadline is None else max(0.0, self.deadline - time.time())
            try:
                # shield: a timeout must not cancel the outcome other code may still resolve.
                status = await asyncio.wait_for(asyncio.shield(watch.outcome), timeout)
            except asyncio.TimeoutError:
                watch.close()
                async with AsyncSparkRestClient(cfg) as client:
                    return await self._deadline_event(client, watch.state)
            except SparkRestError as exc:
                return self._event("error", watch.state, str(exc))
        finally:
            watch.close()
        if status.succeeded:
            return self._event("success", status.state, f"Spark driver {self.submission_id} finished")
        async with AsyncSparkRestClient(cfg) as client:
            return self._event("failed", status.state, await self._failure_message(client, status))

    async def _poll(self, client: AsyncSparkRestClient) -> TriggerEvent:
        errors = 0
        last_state: str | None = None
        while True:
            if self.deadline is not None and time.time() >= self.deadline:
                return await self._deadline_event(client, last_state)
            try:
                status = await client.status(self.submission_id)
            except UnknownSubmissionError as exc:
                return self._event("error", last_state, str(exc))
            except TransientSparkRestError as exc:
                errors += 1
                if errors > self.max_transient_errors:
                    return self._event(
                        "error", last_state, f"{errors} transient errors in a row polling Spark; last: {exc}"
                    )
                self.log.warning(
                    "Transient error %d/%d polling %s: %s",
                    errors,
                    self.max_transient_errors,
                    self.submission_id,
                    exc,
                )
                await self._sleep(min(self.poll_interval * (2 ** (errors - 1)), 30.0))
                continue
            except SparkRestError as exc:
                return self._event("error", last_state, str(exc))
            errors = 0
            if status.state != last_state:
                self.log.info("Spark driver %s is %s", self.submission_id, status.state)
                last_state = status.state
            if not status.active:
                return await self._final_event(client, status)
            await self._sleep(self.poll_interval)

    async def _final_event(self, client: AsyncSparkRestClient, status: DriverStatus) -> TriggerEvent:
        if status.succeeded:
            return self._event("success", status.state, f"Spark driver {self.submission_id} finished")
        return self._event("failed", status.state, await self._failure_message(client, status))

    async def _sleep(self, seconds: float) -> None:
        if self.deadline is not None:
            seconds = max(0.0, min(seconds, self.deadline - time.time()))
        await asyncio.sleep(seconds)

    async def _failure_message(self, client: AsyncSparkRestClient, status: DriverStatus) -> str:
        if status.message is None and status.state == "ERROR":
            # The listing has no message; for ERROR the REST status carries the exception.
            with contextlib.suppress(SparkRestError):
                status = await client.status(self.submission_id)
        detail = status.message or await client.driver_failure_summary(status)
        text = f"Spark driver {self.submission_id} ended {status.state}"
        return f"{text}: {detail}" if detail else text

    async def _deadline_event(self, client: AsyncSparkRestClient, last_state: str | None) -> TriggerEvent:
        """
        The deadline passed: report a driver that already ended as what it ended; kill one that runs.

        The last poll may be up to one interval old, so the driver may have finished in between:
        one more status request decides. A driver that finishes between that request and the
        kill is caught by the kill confirmation (the kill is refused, the state is FINISHED).
        """
        try:
            status = await client.status(self.submission_id)
        except SparkRestError:
            status = None  # cannot tell: killing is the safe side (the kill is refused if it ended)
        if status is not None and not status.active:
            return await self._final_event(client, status)
        self.log.warning("Deadline passed for Spark driver %s: killing it", self.submission_id)
        state = await self._kill_and_confirm(client) or last_state
        if state is not None and state != "KILLED" and state not in ACTIVE_STATES:
            # It ended on its own before the kill landed.
            return await self._final_event(
                client, DriverStatus(submission_id=self.submission_id, state=state)
            )
        return self._event(
            "timeout", state, f"Spark driver {self.submission_id} killed: the task's execution_timeout passed"
        )

    async def _kill_and_confirm(self, client: AsyncSparkRestClient) -> str | None:
        """Kill the driver and wait (bounded) until the master no longer reports it active."""
        try:
            await client.kill(self.submission_id)
        except SparkRestError as exc:
            self.log.warning("Kill of Spark driver %s failed: %s", self.submission_id, exc)
        until = time.monotonic() + KILL_CONFIRM_SECONDS
        state: str | None = None
        while time.monotonic() < until:
            try:
                status = await client.status(self.submission_id)
            except UnknownSubmissionError:
                return state
            except SparkRestError:
                await asyncio.sleep(0.5)
                continue
            state = status.state
            if not status.active:
                return state
            await asyncio.sleep(0.5)
        self.log.warning(
            "Spark driver %s still %s %.0fs after kill", self.submission_id, state, KILL_CONFIRM_SECONDS
        )
        return state

    async def on_kill(self) -> None:
        """
        Kill the driver when the user stopped the task (mark failed/success, clear); not when it moved.

        Airflow 3.3 cancels a trigger that moved to another triggerer through the same path as a
        user's action, so being called does not mean the user acted. The task instance tells: a
        move leaves it deferred (another triggerer waits on the same driver), a user action changes
        its state. When the state cannot be read the driver is left running: a move must never
        kill it, and a stopped task's retry reattaches to it.

        The work runs in a task of its own, shielded: Airflow 3.3.2 sends the cancel again with
        every state sync until the trigger has ended, which would cut ``on_kill`` off between
        the state request and the kill.
        """
        work = asyncio.get_running_loop().create_task(
            self._kill_unless_moved(), name=f"spark-on-kill {self.submission_id}"
        )
        _ON_KILL_TASKS.add(work)
        work.add_done_callback(_ON_KILL_TASKS.discard)
        await asyncio.shield(work)

    async def _kill_unless_moved(self) -> None:
        state = await self._task_instance_state()
        if state == "deferred":
            self.log.info(
                "Trigger cancelled while its task is still deferred: it moved to another triggerer; "
                "Spark driver %s keeps running",
                self.submission_id,
            )
            return
        if state == _UNREADABLE:
            self.log.warning(
                "Trigger cancelled but the task's state cannot be read: leaving Spark driver %s running "
                "(a trigger that moved must not kill it; kill it by hand if the task was stopped)",
                self.submission_id,
            )
            return
        self.log.info("Task is %s: killing Spark driver %s", state, self.submission_id)
        cfg = await self._config()
        async with AsyncSparkRestClient(cfg) as client:
            killed = await self._kill_and_confirm(client)
        self.log.info("Spark driver %s is %s after kill", self.submission_id, killed)

    async def _task_instance_state(self) -> str | None:
        """
        The state of the task instance this trigger waits for (:func:`.task_states.task_instance_state`).

        A trigger not run for a task instance (called directly, not by a triggerer) reports
        ``"no task instance"``: nothing can move it.
        """
        ti = self.task_instance
        if ti is None:
            return "no task instance"
        return await task_instance_state(TaskInstanceRef.of(ti))
