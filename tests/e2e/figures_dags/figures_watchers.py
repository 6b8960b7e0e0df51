"""
Watchers for tests/e2e/test_console_figures_triggerers.py (issue 45 items 12 and 14).

* ``figures_shared``: ONE trigger watching TWO assets (the two watchers are identical, so Airflow
  keeps one trigger for both, and one watcher name): Airflow hands it an asset state store of
  two assets.
* ``figures_moved_low`` / ``figures_moved_high``: two watchers of one queue, each its own trigger;
  the test unpauses ``low`` first, so its trigger id is the lower one.
"""

from __future__ import annotations

import os

from airflow.sdk import DAG, Asset, AssetWatcher

from airflow_shared_stream.sqs.trigger import SqsSharedStreamTrigger

SHARED_QUEUE_URL = os.environ["FIGURES_SHARED_QUEUE_URL"]
MOVED_QUEUE_URL = os.environ["FIGURES_MOVED_QUEUE_URL"]


def _trigger(queue_url: str, match: str | None) -> SqsSharedStreamTrigger:
    return SqsSharedStreamTrigger(queue_url=queue_url, aws_conn_id="aws_default", match=match)


shared_a = Asset(
    "figures_shared_a",
    watchers=[AssetWatcher(name="figures_shared_watcher", trigger=_trigger(SHARED_QUEUE_URL, None))],
)
shared_b = Asset(
    "figures_shared_b",
    watchers=[AssetWatcher(name="figures_shared_watcher", trigger=_trigger(SHARED_QUEUE_URL, None))],
)
moved_low = Asset(
    "figures_moved_low",
    watchers=[AssetWatcher(name="figures_moved_low_watcher", trigger=_trigger(MOVED_QUEUE_URL, None))],
)
moved_high = Asset(
    "figures_moved_high",
    watchers=[
        AssetWatcher(name="figures_moved_high_watcher", trigger=_trigger(MOVED_QUEUE_URL, "body.n >= `0`"))
    ],
)

with DAG(dag_id="figures_shared", schedule=shared_a | shared_b, catchup=False, max_active_runs=1):
    pass

with DAG(dag_id="figures_moved_low", schedule=moved_low, catchup=False, max_active_runs=1):
    pass

with DAG(dag_id="figures_moved_high", schedule=moved_high, catchup=False, max_active_runs=1):
    pass
