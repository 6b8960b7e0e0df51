"""
Kill drivers whose task instance ended while no triggerer ran their trigger.

Airflow 3.3.2 kills a deferred Spark task's driver only through ``on_kill`` in the triggerer
that runs its trigger. When the user marks the task failed while that triggerer is dead, a
live triggerer's ``Trigger.clean_unused`` deletes the trigger row within a second, and the
dead triggerer's triggers are handed over only after ``triggerer_health_check_threshold``: by
then there is nothing to hand over, nobody calls ``on_kill``, and the driver runs on.

So every master poller (:mod:`.poller`) also looks, at most every
:data:`ORPHAN_CHECK_SECONDS`, at the master's active drivers that none of its own watches
wait on: it reads each one's task instance from its launch command once
(:mod:`.task_states`), asks for that task instance's state, and kills a driver whose task has
ended (:data:`~.task_states.ENDED_STATES`), or whose task instance no longer exists (its Dag run
was deleted) when the driver was started by this deployment (:func:`~.task_states.deployment_identity`
in its property): another Airflow sharing the master may run a task of the same ids, and its
drivers are never touched. A task
that is deferred (its trigger runs on another triggerer, or moves), running, queued, up for
retry or cleared keeps its driver, as does a driver of unknown deployment whose task is gone.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Collection

import httpx

from airflow_shared_stream.spark.clients import AsyncSparkRestClient
from airflow_shared_stream.spark.errors import SparkRestError
from airflow_shared_stream.spark.master_ui import ListedDriver, MasterState
from airflow_shared_stream.spark.rest import ACTIVE_STATES
from airflow_shared_stream.spark.task_states import (
    ENDED_STATES,
    GONE,
    TaskInstanceRef,
    deployment_identity,
    task_instance_in_launch_command,
    task_instance_state,
)

log = logging.getLogger(__name__)

ORPHAN_CHECK_SECONDS = 30.0
"""How often a poller looks for orphaned drivers (one task-state request per foreign driver)."""
CONCURRENCY = 16
_UNDECIDED = object()
"""The launch command cannot be read yet (driver not launched, worker UI down): ask again later."""


class OrphanReaper:
    """One poller's view of the master's other drivers: whose they are, and whether to kill them."""

    def __init__(self) -> None:
        self._owners: dict[str, TaskInstanceRef | None] = {}
        """Driver id -> its task instance (``None``: not started by this operator). Never changes."""
        self._next_check = 0.0
        self.killed: list[str] = []
        """Drivers this reaper killed (for tests and logs)."""
        self.checks = 0
        """Checks run to their end (for tests)."""

    async def check(
        self,
        listing: MasterState,
        watched: Collection[str],
        ui: httpx.AsyncClient,
        rest: AsyncSparkRestClient,
    ) -> None:
        """Kill the listed active drivers, not in ``watched``, whose task instance has ended."""
        now = time.monotonic()
        if now < self._next_check:
            return
        self._next_check = now + ORPHAN_CHECK_SECONDS
        foreign = [
            d for d in listing.drivers.values() if d.state in ACTIVE_STATES and d.driver_id not in watched
        ]
        self._owners = {k: v for k, v in self._owners.items() if k in {d.driver_id for d in foreign}}
        gate = asyncio.Semaphore(CONCURRENCY)

        async def one(driver: ListedDriver) -> None:
            async with gate:
                if driver.driver_id not in self._owners:
                    owner = await _owner(ui, listing, driver)
                    if owner is _UNDECIDED:
                        return
                    assert owner is None or isinstance(owner, TaskInstanceRef)
                    self._owners[driver.driver_id] = owner
                ref = self._owners[driver.driver_id]
                if ref is None or self._another_deployments(ref):
                    return
                state = await task_instance_state(ref)
                if state in ENDED_STATES or (state == GONE and self._ours(ref)):
                    await self._kill(rest, driver.driver_id, ref, state)

        await asyncio.gather(*(one(d) for d in foreign))
        self.checks += 1

    @staticmethod
    def _another_deployments(ref: TaskInstanceRef) -> bool:
        """Started by another Airflow sharing the master: its task instance is not ours to ask about."""
        return ref.deployment is not None and ref.deployment != deployment_identity()

    @staticmethod
    def _ours(ref: TaskInstanceRef) -> bool:
        """Whether this deployment started the driver (a task gone here may run in another)."""
        return ref.deployment is not None and ref.deployment == deployment_identity()

    async def _kill(
        self, rest: AsyncSparkRestClient, driver_id: str, ref: TaskInstanceRef, state: str
    ) -> None:
        log.warning(
            "Spark driver %s of task %s.%s (run %s) runs on while its task is %s and no trigger waits "
            "on it: killing it",
            driver_id,
            ref.dag_id,
            ref.task_id,
            ref.run_id,
            state,
        )
        try:
            await rest.kill(driver_id)
        except SparkRestError as exc:
            log.warning("Kill of orphaned Spark driver %s failed: %s", driver_id, exc)
            return
        self.killed.append(driver_id)
        self._owners.pop(driver_id, None)


async def _owner(ui: httpx.AsyncClient, listing: MasterState, driver: ListedDriver) -> object:
    """The task instance in ``driver``'s launch command, ``None`` if it names none, or :data:`_UNDECIDED`."""
    worker_ui = listing.worker_ui.get(driver.worker_id or "")
    if not worker_ui:
        return _UNDECIDED
    try:
        resp = await ui.get(
            f"{worker_ui.rstrip('/')}/log/",
            params={"driverId": driver.driver_id, "logType": "stderr", "offset": 0, "byteLength": 65536},
        )
    except httpx.HTTPError:
        return _UNDECIDED
    if resp.status_code != 200 or "Launch Command" not in resp.text:
        return _UNDECIDED
    return task_instance_in_launch_command(resp.text)
