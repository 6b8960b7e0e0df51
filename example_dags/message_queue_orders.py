"""
One SQS queue watched in the two forms Airflow accepts, side by side.

``orders_created`` is declared the way Airflow's event-driven scheduling guide teaches it:
``MessageQueueTrigger(scheme="shared+sqs", ...)`` from the common.messaging provider (the
``common-messaging`` extra), which hands the arguments to ``SqsSharedStreamTrigger``.
``orders_cancelled`` names ``SqsSharedStreamTrigger`` directly. Both serialize to the same trigger
class, so the triggerer runs ONE receiver for the queue, and a message is deleted only once both
watchers' asset events are persisted. ``shared+kafka``, ``shared+pubsub`` and
``shared+servicebus`` take the other triggers' arguments the same way.

Setting (environment variable): ``ORDERS_SQS_QUEUE_URL``; credentials and endpoint come from the
``aws_default`` connection.
"""

from __future__ import annotations

import os
from typing import Any

from airflow.providers.common.messaging.triggers.msg_queue import MessageQueueTrigger
from airflow.sdk import DAG, Asset, AssetWatcher, task

from airflow_shared_stream.sqs import SqsSharedStreamTrigger

QUEUE_URL = os.environ.get("ORDERS_SQS_QUEUE_URL", "https://sqs.us-east-1.amazonaws.com/000000000000/orders")
# Dead-letter messages that can never become an order (the queue's RedrivePolicy target).
MALFORMED = "body.order_id == null"

# [START howto_trigger_message_queue]
orders_created = Asset(
    "message_queue_orders_created",
    watchers=[
        AssetWatcher(
            name="orders_created_watcher",
            trigger=MessageQueueTrigger(
                scheme="shared+sqs",
                queue_url=QUEUE_URL,
                match="body.type == 'order_created'",
                reject=MALFORMED,
            ),
        )
    ],
)

orders_cancelled = Asset(
    "message_queue_orders_cancelled",
    watchers=[
        AssetWatcher(
            name="orders_cancelled_watcher",
            trigger=SqsSharedStreamTrigger(
                queue_url=QUEUE_URL,
                match="body.type == 'order_cancelled'",
                reject=MALFORMED,
            ),
        )
    ],
)
# [END howto_trigger_message_queue]

with DAG(
    dag_id="message_queue_orders",
    schedule=orders_created | orders_cancelled,
    catchup=False,
    tags=["airflow-shared-stream", "sqs", "common-messaging"],
    doc_md=__doc__,
):

    @task
    def list_orders(*, triggering_asset_events: Any = None) -> list[str]:
        """The order ids of the messages that triggered this run (the SQS envelope's body)."""
        return [
            event.extra["payload"]["body"]["order_id"]
            for events in (triggering_asset_events or {}).values()
            for event in events
        ]

    list_orders()
