"""
Which task instance a Spark driver was started for, and what that task instance's state is now.

Why: Airflow deletes a trigger whose task is no longer deferred (``Trigger.clean_unused``, on
any live triggerer, within a second of the state change) but calls ``on_kill`` only in the
triggerer that runs the trigger. If that triggerer is dead, nobody kills the driver of a task
the user marked failed. The operator therefore starts each driver with its task instance in a
Spark property (:data:`TASK_INSTANCE_PROPERTY`), which the worker writes into the driver's
launch command; a triggerer polling the master reads it back and asks for the task's state.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import re
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs, urlencode

log = logging.getLogger(__name__)

TASK_INSTANCE_PROPERTY = "spark.airflow.taskInstance"
"""Spark property naming the driver's task instance (URL-encoded ``dag_id``, ``run_id``,
``task_id``, ``map_index``): no quote or space, so it reads back from the launch command whole."""

_IN_LAUNCH_COMMAND = re.compile(r'"-D' + re.escape(TASK_INSTANCE_PROPERTY) + r'=([^"\s]*)"')

UNREADABLE = "<unreadable>"
"""What :func:`task_instance_state` answers when it cannot ask (never a real state)."""

GONE = "<gone>"
"""What :func:`task_instance_state` answers for a task instance that no longer exists (its Dag
run was deleted): absent from the execution API's answer, where a cleared one is there with no
state (never a real state)."""

_DEPLOYMENT_LABEL = b"airflow-shared-stream spark driver owner"

ENDED_STATES = frozenset({"success", "failed", "skipped", "removed", "upstream_failed"})
"""Task states in which nothing waits on the driver any more: no trigger, no try to reattach.

Not ``None`` (a cleared task: its next try reattaches to the running driver), nor
``up_for_retry``, ``scheduled``, ``queued``, ``running`` or ``deferred``."""


@dataclass(frozen=True)
class TaskInstanceRef:
    """A task instance, as a trigger or a driver's launch command names it."""

    dag_id: str
    run_id: str
    task_id: str
    map_index: int = -1
    deployment: str | None = None
    """:func:`deployment_identity` of the Airflow that started the driver (``None``: unknown)."""

    def encode(self) -> str:
        fields: dict[str, str | int] = {
            "dag_id": self.dag_id,
            "run_id": self.run_id,
            "task_id": self.task_id,
            "map_index": self.map_index,
        }
        if self.deployment is not None:
            fields["deployment"] = self.deployment
        return urlencode(fields)

    @classmethod
    def of(cls, ti: Any, deployment: str | None = None) -> TaskInstanceRef:
        map_index = getattr(ti, "map_index", -1)
        return cls(
            dag_id=str(ti.dag_id),
            run_id=str(ti.run_id),
            task_id=str(ti.task_id),
            map_index=-1 if map_index is None else int(map_index),
            deployment=deployment,
        )


def deployment_identity() -> str | None:
    """
    A short name of this Airflow deployment, the same in all of its components, that reveals no secret.

    Two deployments may share a Spark master and name drivers of equal Dag, run and task ids: a
    task instance that does not exist here may be running in the other. ``[api] secret_key``
    is shared by the workers and triggerers of one deployment (the api-server signs its
    requests for their logs with it); an HMAC of a fixed label under it tells deployments apart
    without revealing it. ``None`` when the key is not set.
    """
    from airflow.configuration import conf

    key = conf.get("api", "secret_key", fallback="")
    if not key:
        return None
    return hmac.new(key.encode(), _DEPLOYMENT_LABEL, hashlib.sha256).hexdigest()[:16]


def decode(value: str) -> TaskInstanceRef | None:
    """The task instance :meth:`TaskInstanceRef.encode` wrote, or ``None`` for anything else."""
    fields = {k: v[0] for k, v in parse_qs(value, keep_blank_values=True).items() if v}
    try:
        return TaskInstanceRef(
            dag_id=fields["dag_id"],
            run_id=fields["run_id"],
            task_id=fields["task_id"],
            map_index=int(fields.get("map_index", "-1")),
            deployment=fields.get("deployment") or None,
        )
    except (KeyError, ValueError):
        return None


def task_instance_in_launch_command(stderr_head: str) -> TaskInstanceRef | None:
    """The task instance a driver's launch command (the top of its stderr) names, if any."""
    found = _IN_LAUNCH_COMMAND.search(stderr_head)
    return decode(found.group(1)) if found else None


async def task_instance_state(ref: TaskInstanceRef) -> str | None:
    """
    The state of ``ref``, asked of the triggerer's supervisor (triggers cannot reach the database).

    ``None`` when the task instance has no state (cleared), :data:`GONE` when it is not in the
    answer (its run deleted), :data:`UNREADABLE` when it cannot be asked (outside a triggerer,
    an error answer).
    """
    try:
        from airflow.sdk.execution_time import task_runner
        from airflow.sdk.execution_time.comms import GetTaskStates, TaskStatesResult

        comms = getattr(task_runner, "SUPERVISOR_COMMS", None)
        if comms is None:
            return UNREADABLE
        answer = await comms.asend(
            GetTaskStates(
                dag_id=ref.dag_id, task_ids=[ref.task_id], run_ids=[ref.run_id], map_index=ref.map_index
            )
        )
    except Exception as exc:
        log.warning("Cannot ask for the task instance's state: %s", type(exc).__name__)
        return UNREADABLE
    if not isinstance(answer, TaskStatesResult):
        log.warning("Cannot ask for the task instance's state: %s", type(answer).__name__)
        return UNREADABLE
    key = ref.task_id if ref.map_index < 0 else f"{ref.task_id}_{ref.map_index}"
    states = answer.task_states.get(ref.run_id, {})
    if key not in states:
        return GONE
    state = states[key]
    return None if state is None else str(getattr(state, "value", state))
