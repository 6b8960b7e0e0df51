"""
Two Dags, each with three Kafka watchers and three SQS watchers of ONE topic and ONE queue.

The HA e2e test (tests/e2e/test_ha_two_triggerers.py) unpauses ``ha_first``, starts triggerer A
(capacity 6, so it takes exactly ha_first's six watchers), then unpauses ``ha_second`` and starts
triggerer B: each stream ends up with three watchers on each triggerer. Every watcher has its own
asset, so the asset events tell which watcher saw which message. The ``match`` expressions are
all true for the test's messages; they differ only so that Airflow, which deduplicates watcher
triggers by classpath and kwargs, keeps six distinct triggers per stream.
"""

from __future__ import annotations

import os

from airflow.providers.standard.operators.empty import EmptyOperator
from airflow.sdk import DAG, Asset, AssetAny, AssetWatcher

from airflow_shared_stream.kafka.trigger import KafkaSharedStreamTrigger
from airflow_shared_stream.sqs.trigger import SqsSharedStreamTrigger

TOPIC = os.environ.get("HA_KAFKA_TOPIC", "ha-orders")
QUEUE_URL = os.environ.get("HA_SQS_QUEUE_URL", "http://127.0.0.1:4566/000000000000/ha-orders")


def _match(index: int) -> str:
    return f"not_null(value.event_id) && value.watcher_probe != 'w{index}'"


def _sqs_match(index: int) -> str:
    return f"not_null(body.event_id) && body.watcher_probe != 'w{index}'"


def _assets(indexes: range) -> list[Asset]:
    assets = []
    for i in indexes:
        kafka = KafkaSharedStreamTrigger(topics=[TOPIC], kafka_config_id="kafka_default", match=_match(i))
        sqs = SqsSharedStreamTrigger(QUEUE_URL, aws_conn_id="aws_default", match=_sqs_match(i))
        assets.append(
            Asset(f"ha_kafka_w{i}", watchers=[AssetWatcher(name=f"ha_kafka_w{i}_watcher", trigger=kafka)])
        )
        assets.append(
            Asset(f"ha_sqs_w{i}", watchers=[AssetWatcher(name=f"ha_sqs_w{i}_watcher", trigger=sqs)])
        )
    return assets


for dag_id, indexes in (("ha_first", range(1, 4)), ("ha_second", range(4, 7))):
    with DAG(dag_id=dag_id, schedule=AssetAny(*_assets(indexes)), catchup=False, tags=["ha-e2e"]):
        EmptyOperator(task_id="noop")
