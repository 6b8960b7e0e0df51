"""
Quickstart: one SQS queue, one watcher, one Dag (docs/quickstart.rst).

Each message on the queue whose body has ``"type": "order_created"`` becomes an asset event,
and each asset event a run of ``orders_quickstart``; the queue's other messages are deleted
without one.
"""

from __future__ import annotations

from airflow.sdk import DAG, Asset, AssetWatcher, task

from airflow_shared_stream.sqs import SqsSharedStreamTrigger

QUEUE_URL = "https://sqs.eu-west-1.amazonaws.com/123456789012/orders"

orders = Asset(
    "sqs://orders",
    watchers=[
        AssetWatcher(
            name="orders_watcher",
            trigger=SqsSharedStreamTrigger(
                QUEUE_URL,
                aws_conn_id="aws_default",
                match="body.type == 'order_created'",
            ),
        )
    ],
)

with DAG("orders_quickstart", schedule=[orders]):

    @task
    def show(*, triggering_asset_events=None):
        for event in triggering_asset_events[orders]:
            print("order", event.extra["payload"]["body"])

    show()
