"""
State a triggerer process keeps per stream, and how a test plays several triggerers in one process.

Some stream state belongs to the triggerer *process*: which Kafka watchers a stream serves there
(:mod:`airflow_shared_stream.kafka.watchers`). In production that is a module-level dict. The
test harness (:class:`airflow_shared_stream.testing.SharedStreamHarness`) runs one "triggerer" per
instance, several of them in one process to test high availability, so the state is looked up
through a context variable: each harness sets its own dict in the tasks it starts, and asyncio
copies the context into every task those tasks create (the manager's poll task, the filters).
"""

from __future__ import annotations

from contextvars import ContextVar
from typing import Any

_process_state: dict[str, Any] = {}

triggerer_scope: ContextVar[dict[str, Any]] = ContextVar(
    "shared_stream_triggerer_scope", default=_process_state
)
"""The per-triggerer state dict of the running task: the process's own unless a harness set one."""


def scoped(name: str, factory: Any) -> Any:
    """The value ``name`` in the current triggerer's state, created by ``factory()`` on first use."""
    state = triggerer_scope.get()
    value = state.get(name)
    if value is None:
        value = state[name] = factory()
    return value
