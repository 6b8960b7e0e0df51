"""
Amazon SQS order events -> asset events -> PySpark -> Parquet.

Three assets watch ONE SQS queue through ``SqsSharedStreamTrigger`` (one long-polling receiver
in the triggerer; a message is deleted only after every watcher's asset event is persisted).
Malformed events go to the dead-letter queue. See ``order_pipeline.py`` for the tasks.

Settings (environment variables): ``ORDERS_SQS_QUEUE_URL`` and
``ORDERS_SQS_DEAD_LETTER_QUEUE_URL`` (empty: the queue's RedrivePolicy target); credentials and
endpoint come from the ``aws_default`` connection.
"""

from __future__ import annotations

from typing import Any

from airflow.sdk import DAG
from order_pipeline import build_pipeline, reject_expression, setting, watched_assets

from airflow_shared_stream.sqs.trigger import SqsSharedStreamTrigger

QUEUE_URL = setting("ORDERS_SQS_QUEUE_URL", "https://sqs.us-east-1.amazonaws.com/000000000000/orders")
DEAD_LETTER_QUEUE_URL = setting("ORDERS_SQS_DEAD_LETTER_QUEUE_URL", "") or None


# [START howto_trigger_sqs_shared_stream]
def _trigger(match: str) -> SqsSharedStreamTrigger:
    return SqsSharedStreamTrigger(
        queue_url=QUEUE_URL,
        aws_conn_id="aws_default",
        match=match,
        reject=reject_expression("body"),
        dead_letter_queue_url=DEAD_LETTER_QUEUE_URL,
    )


# [END howto_trigger_sqs_shared_stream]


def _position(payload: dict[str, Any]) -> str:
    return str(payload.get("message_id"))


created, cancelled, large = watched_assets("sqs", "body", _trigger)

with DAG(
    dag_id="sqs_orders_pipeline",
    schedule=created | cancelled | large,
    max_active_runs=1,
    catchup=False,
    tags=["airflow-shared-stream", "sqs", "spark"],
    doc_md=__doc__,
):
    build_pipeline("sqs", "body", _position)
