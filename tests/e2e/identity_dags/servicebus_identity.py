"""
Service Bus watchers that name one queue through two connection ids (the e2e test of stream
identity, tests/e2e/test_servicebus_identity.py).

``identity_together`` has two watchers of queue ``IDENTITY_TOGETHER_QUEUE``, one through ``sb_a``
and one through ``sb_b`` (the same namespace, spelled two ways): one triggerer runs both, and they
must share one receiver. ``identity_split_a`` and ``identity_split_b`` each watch queue
``IDENTITY_SPLIT_QUEUE``, through ``sb_a`` and ``sb_b``: the test puts them on two triggerers,
where the split-stream check must report them as one stream.
"""

from __future__ import annotations

import os

from airflow.providers.standard.operators.empty import EmptyOperator
from airflow.sdk import DAG, Asset, AssetAny, AssetWatcher

from airflow_shared_stream.servicebus.trigger import ServiceBusSharedStreamTrigger

TOGETHER = os.environ.get("IDENTITY_TOGETHER_QUEUE", "identity-together")
SPLIT = os.environ.get("IDENTITY_SPLIT_QUEUE", "identity-split")


def _asset(name: str, queue: str, conn_id: str) -> Asset:
    trigger = ServiceBusSharedStreamTrigger(queue, azure_service_bus_conn_id=conn_id)
    return Asset(name, watchers=[AssetWatcher(name=f"{name}_watcher", trigger=trigger)])


with DAG(
    dag_id="identity_together",
    schedule=AssetAny(
        _asset("identity_together_a", TOGETHER, "sb_a"), _asset("identity_together_b", TOGETHER, "sb_b")
    ),
    catchup=False,
):
    EmptyOperator(task_id="noop")

for suffix in ("a", "b"):
    with DAG(
        dag_id=f"identity_split_{suffix}",
        schedule=_asset(f"identity_split_{suffix}", SPLIT, f"sb_{suffix}"),
        catchup=False,
    ):
        EmptyOperator(task_id="noop")
