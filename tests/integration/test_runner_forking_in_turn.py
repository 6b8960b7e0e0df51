"""
A trigger runner that forks in turn (a trigger using ``multiprocessing``'s fork context, or
``os.fork``) inherits its supervisor's fork hooks (issue 50, :mod:`airflow_shared_stream.runner_fork`).

The hooks read "a triggerer's process that has not forked its runner yet" from the supervisor's
state the runner inherited (its job list, and ``runner_forked``, which the supervisor sets only in
itself after the fork). So in the runner they ran again: on the runner's event loop, before the
fork, the streams' imports and a whole new in-process Execution API (its app, Cadwyn's routers,
its loop thread and an AnyIO worker thread), seconds on a loaded machine, for an API the runner
never uses; the fork was done with those threads alive; and after it the runner unfroze the heap
it inherited (``_froze_heap``, the supervisor's, came along), so its next full collection walks
the supervisor's whole heap on the loop, the block the freeze removed. A trigger forks once from
inside a real ``airflow triggerer``'s runner and reports what the fork left: an event, not a
timing.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.runner_probe import probe_report

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

DAG = """
from airflow.sdk import DAG, Asset, AssetWatcher
from airflow.providers.standard.operators.empty import EmptyOperator
from tests.support.fork_probe import ForkProbeTrigger

probe = Asset("fork_probe", watchers=[AssetWatcher(name="fork_probe_w", trigger=ForkProbeTrigger())])
with DAG(dag_id="fork_probe", schedule=probe, catchup=False):
    EmptyOperator(task_id="nothing")
"""


def test_a_fork_inside_the_trigger_runner_builds_no_execution_api_there(tmp_path: Path) -> None:
    """FAULT_MODEL 13 (load) and 7 (liveness): the supervisor's pre-fork work ran on the runner's loop."""
    payload = probe_report(tmp_path, DAG, "fork_probe")
    assert payload["frozen_after"] == payload["frozen_before"] > 0, (
        f"a fork inside the trigger runner unfroze the heap it inherited from its supervisor: "
        f"its next full collection walks it on the loop ({payload})"
    )
    assert payload["new_threads"] == [], (
        f"a fork inside the trigger runner ran the supervisor's pre-fork warm-up on the runner's "
        f"loop ({payload['fork_seconds']} s): threads left {payload['new_threads']}"
    )
