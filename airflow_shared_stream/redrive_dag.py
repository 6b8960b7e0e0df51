"""
The redrive Dag, shipped: a one-line Dag file builds it, and the Streams page starts its runs.

A Dags folder holds only what a deployment puts there, so the package cannot install a Dag by
itself; it gives the Dag whole instead, to be named by a file of one line::

    from airflow_shared_stream.redrive_dag import redrive_dead_letters_dag

    dag = redrive_dead_letters_dag()

With ``[core] multi_team``, each team that redrives puts its own in a Dag bundle of that team
(``redrive_dead_letters_dag(team="team_a")``, Dag id ``shared_stream_redrive_dead_letters__team_a``):
a run's conf and XCom are readable by whoever may read its Dag, so one team's redrives never run
in a Dag another team reads. The page starts the Dag of the stream's team, and the task refuses a
grant made for another team's Dag than its own (docs/redrive.rst).

Its task moves only what the Streams page granted for the run and the person who started it
(``require_grant``, docs/redrive.rst): whoever may trigger it cannot name another queue or
connection in the run's conf.
"""

from __future__ import annotations

import datetime
from typing import Any

from airflow.sdk import DAG, Param

from airflow_shared_stream.brokers import broker_names
from airflow_shared_stream.redrive import RedriveDeadLettersOperator

__all__ = ["REDRIVE_DAG_ID", "REDRIVE_TASK_ID", "redrive_dag_id", "redrive_dead_letters_dag"]

REDRIVE_DAG_ID = "shared_stream_redrive_dead_letters"
"""The redrive Dag of no team: ``RedriveDeadLettersOperator`` from its params (one run per redrive)."""
REDRIVE_TASK_ID = "redrive"
"""Its one task: the page binds a run's grant to this task's instance (redrive_grant.bind_grant)."""
TEAM_SEPARATOR = "__"


def redrive_dag_id(team: str | None) -> str:
    """
    The id of the redrive Dag the page runs for a stream of ``team`` (``None``: no team).

    With ``[core] multi_team``, a run's conf and XCom are read by whoever may read its Dag, so each
    team redrives through its own Dag, in a bundle of that team: ``<REDRIVE_DAG_ID>__<team>``.
    """
    return f"{REDRIVE_DAG_ID}{TEAM_SEPARATOR}{team}" if team else REDRIVE_DAG_ID


def redrive_params() -> dict[str, Param]:
    """The run's params: what the Streams page fills (and the trigger form shows)."""
    return {
        "broker": Param("sqs", enum=list(broker_names()), description="The broker."),
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
    }


def redrive_dead_letters_dag(dag_id: str | None = None, *, team: str | None = None, **dag_kwargs: Any) -> DAG:
    """
    The Dag the Streams page runs for a redrive; ``dag_kwargs`` go to ``DAG`` (tags, access control).

    ``team``: the team whose streams it redrives; the file goes in a Dag bundle of that team (the
    page refuses a Dag found in another team's bundle, the task a grant made for another team).
    Keep the default ``dag_id`` (:func:`redrive_dag_id` of ``team``): the page starts runs of that
    Dag. ``schedule`` is always None and ``max_active_runs`` 1: two redrives of one dead-letter
    source would hold each other's messages.
    """
    tags = dag_kwargs.pop("tags", ["shared-stream", "operations"])
    with DAG(
        dag_id=dag_id or redrive_dag_id(team),
        schedule=None,
        start_date=dag_kwargs.pop("start_date", datetime.datetime(2026, 1, 1, tzinfo=datetime.timezone.utc)),
        catchup=False,
        max_active_runs=1,
        render_template_as_native_obj=True,  # max_messages and the flags reach the task as values
        tags=tags,
        params=redrive_params(),
        doc_md=__doc__,
        **dag_kwargs,
    ) as dag:
        RedriveDeadLettersOperator(
            task_id=REDRIVE_TASK_ID,
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
    return dag
