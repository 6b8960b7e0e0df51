"""
Kafka order events -> asset events -> PySpark -> Parquet.

Three assets watch ONE Kafka topic through ``KafkaSharedStreamTrigger`` (one consumer in the
triggerer, one consumer group; offsets are committed only after every watcher's asset event is
persisted). Malformed events go to the dead-letter topic. See ``order_pipeline.py`` for the
tasks.

Settings (environment variables): ``ORDERS_KAFKA_TOPIC`` (``orders``),
``ORDERS_KAFKA_DEAD_LETTER_TOPIC`` (``orders.dlq``), ``ORDERS_KAFKA_GROUP_ID``
(``airflow-orders-pipeline``); the broker comes from the ``kafka_default`` connection.
"""

from __future__ import annotations

from typing import Any

from airflow.sdk import DAG
from order_pipeline import build_pipeline, reject_expression, setting, watched_assets

from airflow_shared_stream.kafka.trigger import KafkaSharedStreamTrigger

TOPIC = setting("ORDERS_KAFKA_TOPIC", "orders")
DEAD_LETTER_TOPIC = setting("ORDERS_KAFKA_DEAD_LETTER_TOPIC", "orders.dlq")
GROUP_ID = setting("ORDERS_KAFKA_GROUP_ID", "airflow-orders-pipeline")


# [START howto_trigger_kafka_shared_stream]
def _trigger(match: str) -> KafkaSharedStreamTrigger:
    return KafkaSharedStreamTrigger(
        topics=[TOPIC],
        kafka_config_id="kafka_default",
        group_id=GROUP_ID,
        match=match,
        reject=reject_expression("value"),
        dead_letter_topic=DEAD_LETTER_TOPIC,
    )


# [END howto_trigger_kafka_shared_stream]


def _position(payload: dict[str, Any]) -> str:
    return f"{payload.get('topic')}/{payload.get('partition')}@{payload.get('offset')}"


created, cancelled, large = watched_assets("kafka", "value", _trigger)

with DAG(
    dag_id="kafka_orders_pipeline",
    schedule=created | cancelled | large,
    max_active_runs=1,
    catchup=False,
    tags=["airflow-shared-stream", "kafka", "spark"],
    doc_md=__doc__,
):
    build_pipeline("kafka", "value", _position)
