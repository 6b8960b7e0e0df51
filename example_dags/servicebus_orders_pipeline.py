"""
Azure Service Bus order events -> asset events -> PySpark -> Parquet.

Three assets watch ONE Service Bus queue through ``ServiceBusSharedStreamTrigger`` (one
peek-lock receiver in the triggerer; a message is completed only after every watcher's asset
event is persisted, abandoned if a watcher failed, dead-lettered with the rejecting watcher
named if one rejected it). See ``order_pipeline.py`` for the tasks.

Settings come from environment variables, read at parse time without touching the metadata
database: ``ORDERS_SERVICEBUS_QUEUE`` (the queue, ``orders`` by default) and
``ORDERS_SERVICEBUS_CONN_ID`` (``azure_service_bus_default``); the namespace and credential come
from that ``azure_service_bus`` connection (a connection string, or a namespace and credential).
"""

from __future__ import annotations

from typing import Any

from airflow.sdk import DAG
from order_pipeline import build_pipeline, reject_expression, setting, watched_assets

from airflow_shared_stream.servicebus.trigger import ServiceBusSharedStreamTrigger

QUEUE = setting("ORDERS_SERVICEBUS_QUEUE", "orders")
CONN_ID = setting("ORDERS_SERVICEBUS_CONN_ID", "azure_service_bus_default")


# [START howto_trigger_servicebus_shared_stream]
def _trigger(match: str) -> ServiceBusSharedStreamTrigger:
    return ServiceBusSharedStreamTrigger(
        queue_name=QUEUE,
        azure_service_bus_conn_id=CONN_ID,
        match=match,
        reject=reject_expression("body"),
    )


# [END howto_trigger_servicebus_shared_stream]


def _position(payload: dict[str, Any]) -> str:
    return f"{payload.get('entity')}#{payload.get('sequence_number')}"


created, cancelled, large = watched_assets("servicebus", "body", _trigger)

with DAG(
    dag_id="servicebus_orders_pipeline",
    schedule=created | cancelled | large,
    max_active_runs=1,
    catchup=False,
    tags=["airflow-shared-stream", "servicebus", "spark"],
    doc_md=__doc__,
):
    build_pipeline("servicebus", "body", _position)
