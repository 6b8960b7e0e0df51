"""
Send dead-lettered messages back to their source: one task, every broker, started with params.

Start it from the Streams page: the page fills the broker, the connection and both addresses from
the stream's watchers and signs them for the run once it checked that you may trigger the
stream's Dags; a run triggered any other way is refused at run time (docs/redrive.rst). It is
a Dag run, so a redrive is audited, retried and logged like any task. ``dry_run`` is on by
default: the first run of a redrive counts and samples what would move.
"""

from __future__ import annotations

import datetime

from airflow.sdk import DAG, Param

from airflow_shared_stream.redrive import RedriveDeadLettersOperator

with DAG(
    dag_id="shared_stream_redrive_dead_letters",
    schedule=None,
    start_date=datetime.datetime(2026, 1, 1, tzinfo=datetime.timezone.utc),
    catchup=False,
    max_active_runs=1,  # two redrives of one dead-letter source would hold each other's messages
    render_template_as_native_obj=True,  # max_messages and the flags reach the task as values
    tags=["shared-stream", "operations"],
    params={
        "broker": Param("sqs", enum=["kafka", "sqs", "pubsub", "servicebus"], description="The broker."),
        "conn_id": Param(
            None, type=["null", "string"], description="Airflow connection; the triggers' default if empty."
        ),
        "source": Param(
            None,
            type=["null", "string"],
            description="Where messages go back to: Kafka topic, SQS queue URL, Pub/Sub topic, "
            "Service Bus queue or <topic>/Subscriptions/<subscription>.",
        ),
        "dead_letter": Param(
            None,
            type=["null", "string"],
            description="Where they are: Kafka dead-letter topic, SQS dead-letter queue URL, "
            "Pub/Sub dead-letter subscription (Service Bus: leave empty).",
        ),
        "filter": Param(
            None, type=["null", "string"], description="JMESPath over the envelope the triggers see."
        ),
        "max_messages": Param(
            100,
            type=["null", "integer"],
            minimum=1,
            description="Move at most this many; empty: 100. Never more than the dead-letter source "
            "held when the redrive started.",
        ),
        "dry_run": Param(True, type="boolean", description="Only count and sample; move nothing."),
        "keep_origin_attributes": Param(
            False, type="boolean", description="Keep the reason and origin our dead-lettering added."
        ),
        "grant": Param(
            None,
            type=["null", "string"],
            description="Set by the Streams page once it checked that you may trigger the stream's Dags; "
            "a run without it is refused (docs/redrive.rst).",
        ),
    },
):
    RedriveDeadLettersOperator(
        task_id="redrive",
        broker="{{ params.broker }}",
        conn_id="{{ params.conn_id }}",
        source="{{ params.source }}",
        dead_letter="{{ params.dead_letter }}",
        filter="{{ params.filter }}",
        max_messages="{{ params.max_messages }}",
        dry_run="{{ params.dry_run }}",
        keep_origin_attributes="{{ params.keep_origin_attributes }}",
        require_grant=True,  # addresses from conf: only what the page granted
        grant="{{ params.grant }}",
        retries=0,  # a redrive that failed half-way is started again by a person, with its summary
    )
