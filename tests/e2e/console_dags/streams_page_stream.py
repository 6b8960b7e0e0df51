"""
One SQS stream with two watchers, for the Streams page tests: every order, and the cancelled ones.

Bodies with ``"poison": true`` are rejected (dead-lettered to the stream's dead-letter queue),
so the page has a dead-letter depth to show and something to redrive.
"""

from __future__ import annotations

import os

from airflow.sdk import DAG, Asset, AssetWatcher

from airflow_shared_stream.sqs.trigger import SqsSharedStreamTrigger

QUEUE_URL = os.environ["CONSOLE_SQS_QUEUE_URL"]
DEAD_LETTER_QUEUE_URL = os.environ["CONSOLE_SQS_DEAD_LETTER_QUEUE_URL"]


def _watcher(name: str, match: str | None) -> AssetWatcher:
    return AssetWatcher(
        name=name,
        trigger=SqsSharedStreamTrigger(
            queue_url=QUEUE_URL,
            aws_conn_id="aws_default",
            match=match,
            reject="body.poison == `true`",
            dead_letter_queue_url=DEAD_LETTER_QUEUE_URL,
        ),
    )


every_order = Asset("console_every_order", watchers=[_watcher("console_every_order_watcher", None)])
cancelled = Asset(
    "console_cancelled_orders",
    watchers=[_watcher("console_cancelled_watcher", "body.kind == 'cancelled'")],
)

with DAG(dag_id="console_orders", schedule=every_order, catchup=False, max_active_runs=1):
    pass

with DAG(dag_id="console_cancellations", schedule=cancelled, catchup=False, max_active_runs=1):
    pass
