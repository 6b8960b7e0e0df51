"""
Google Cloud Pub/Sub order events -> asset events -> PySpark -> Parquet.

Three assets watch ONE Pub/Sub subscription through ``PubSubSharedStreamTrigger`` (one
subscriber in the triggerer; a message is acknowledged only after every watcher's asset event is
persisted). Malformed events are published to the dead-letter topic, then acknowledged. See
``order_pipeline.py`` for the tasks.

Settings (environment variables, read when the file is parsed):
``ORDERS_PUBSUB_SUBSCRIPTION`` (``orders-airflow``: a subscription id, or its full path),
``ORDERS_PUBSUB_PROJECT`` (empty: the connection's project) and
``ORDERS_PUBSUB_DEAD_LETTER_TOPIC`` (``orders-dlq``; empty: the topic of the subscription's own
dead-letter policy; with neither, these watchers, which reject, are refused at start).
Credentials and the project come from the ``google_cloud_default`` connection;
``PUBSUB_EMULATOR_HOST`` points the triggerer at an emulator.
"""

from __future__ import annotations

from typing import Any

from airflow.sdk import DAG
from order_pipeline import build_pipeline, reject_expression, setting, watched_assets

from airflow_shared_stream.pubsub.trigger import PubSubSharedStreamTrigger

SUBSCRIPTION = setting("ORDERS_PUBSUB_SUBSCRIPTION", "orders-airflow")
PROJECT_ID = setting("ORDERS_PUBSUB_PROJECT", "") or None
DEAD_LETTER_TOPIC = setting("ORDERS_PUBSUB_DEAD_LETTER_TOPIC", "orders-dlq") or None


# [START howto_trigger_pubsub_shared_stream]
def _trigger(match: str) -> PubSubSharedStreamTrigger:
    return PubSubSharedStreamTrigger(
        SUBSCRIPTION,
        project_id=PROJECT_ID,
        gcp_conn_id="google_cloud_default",
        match=match,
        reject=reject_expression("body"),
        dead_letter_topic=DEAD_LETTER_TOPIC,
    )


# [END howto_trigger_pubsub_shared_stream]


def _position(payload: dict[str, Any]) -> str:
    return str(payload.get("message_id"))


created, cancelled, large = watched_assets("pubsub", "body", _trigger)

with DAG(
    dag_id="pubsub_orders_pipeline",
    schedule=created | cancelled | large,
    max_active_runs=1,
    catchup=False,
    tags=["airflow-shared-stream", "pubsub", "spark"],
    doc_md=__doc__,
):
    build_pipeline("pubsub", "body", _position)
