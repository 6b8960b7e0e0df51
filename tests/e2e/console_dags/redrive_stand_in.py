"""
A stand-in with the id and params of the provider's redrive example Dag, for the Streams page
tests: the page only creates a run of it, with the stream's params as the run's conf.
"""

from __future__ import annotations

from airflow.sdk import DAG, Param

with DAG(
    dag_id="shared_stream_redrive_dead_letters",
    schedule=None,
    catchup=False,
    is_paused_upon_creation=True,
    params={
        "broker": Param("sqs", type="string"),
        "conn_id": Param(None, type=["null", "string"]),
        "source": Param({}, type="object"),
        "dead_letter": Param(None),
        "filter": Param(None, type=["null", "string"]),
        "max_messages": Param(None, type=["null", "integer"]),
        "dry_run": Param(True, type="boolean"),
        "keep_origin_attributes": Param(False, type="boolean"),
    },
):
    pass
