"""
``RedriveDeadLettersOperator``: send dead-lettered messages back to their source, for any broker.

A task, so a redrive is audited, retried and logged like any other (the Streams page starts one
as a run of ``example_dags/shared_stream_redrive_dead_letters.py``). The work is
:func:`airflow_shared_stream.common.redrive.redrive` over the broker's dead-letter source
(``<broker>/redrive.py``, opened through the broker's ``operations.py`` and the registry of
:mod:`airflow_shared_stream.brokers`); credentials come from the same Airflow connections as the triggers.
See docs/redrive.rst.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from typing import Any

from airflow.sdk import BaseOperator

from airflow_shared_stream.brokers import broker_names, broker_operations
from airflow_shared_stream.common.redrive import (
    DEFAULT_MAX_MESSAGES,
    DeadLetterSource,
    RedriveConfigurationError,
    check_max_messages,
    compile_filter,
    redrive,
    refuse_loop,
)
from airflow_shared_stream.redrive_grant import GRANT_PARAM, GrantNotBoundError, check_grant

_TRUE = ("true", "1", "yes", "on")
_FALSE = ("false", "0", "no", "off", "")
GRANT_BIND_WAIT_KEY = "redrive_grant_bind_wait_seconds"
"""``[shared_stream] redrive_grant_bind_wait_seconds``: how long a task that started before the
page bound its grant asks its run again."""
GRANT_BIND_WAIT_SECONDS = 120.0
GRANT_BIND_POLL_SECONDS = 1.0


def grant_bind_wait_seconds() -> float:
    """The configured wait for the page's binding of a grant; a bad value is refused by name."""
    from airflow.configuration import conf

    try:
        wait = conf.getfloat("shared_stream", GRANT_BIND_WAIT_KEY, fallback=GRANT_BIND_WAIT_SECONDS)
    except Exception as exc:  # AirflowConfigException: not a number
        raise RedriveConfigurationError(f"[shared_stream] {GRANT_BIND_WAIT_KEY}: {exc}") from None
    if not wait >= 0:  # NaN too
        raise RedriveConfigurationError(
            f"[shared_stream] {GRANT_BIND_WAIT_KEY} must be 0 or more, not {wait}"
        )
    return wait


def dead_letter_source(
    broker: str,
    *,
    source: str | None = None,
    dead_letter: str | None = None,
    conn_id: str | None = None,
    keep_origin_attributes: bool = False,
    broker_options: dict[str, Any] | None = None,
) -> DeadLetterSource:
    """The broker's dead-letter source (``<broker>/redrive.py``); raises on bad arguments."""
    operations = broker_operations(broker)
    if operations is None:
        raise RedriveConfigurationError(f"broker must be one of {', '.join(broker_names())}, got {broker!r}")
    options = dict(broker_options or {})
    unknown = sorted(set(options) - operations.redrive_options)
    if unknown:
        raise RedriveConfigurationError(
            f"broker_options {unknown} are not options of a {broker} redrive "
            f"(it takes: {', '.join(sorted(operations.redrive_options)) or 'none'})"
        )
    if operations.redrive_needs_dead_letter and not dead_letter:
        raise RedriveConfigurationError(f"a {broker} redrive needs dead_letter (where the dead letters are)")
    built = operations.dead_letter_source(
        source=source or None,
        dead_letter=dead_letter or None,
        conn_id=conn_id or None,
        keep_origin_attributes=keep_origin_attributes,
        **options,
    )
    refuse_loop(built)  # what is known before connecting fails when the Dag is parsed
    return built


def _flag(name: str, value: Any) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in _TRUE + _FALSE:
        return value.strip().lower() in _TRUE
    raise RedriveConfigurationError(f"{name} must be true or false, got {value!r}")


def _count(value: Any) -> int:
    """A blank count (``None``, an empty field, a rendered ``None``) is the default, never unbounded."""
    if value in (None, "", "None", "null"):
        return DEFAULT_MAX_MESSAGES
    if isinstance(value, str) and value.strip().isdigit():
        value = int(value.strip())
    return check_max_messages(value)


class RedriveDeadLettersOperator(BaseOperator):
    """
    Move dead-lettered messages back to their source, at least once: a message leaves the
    dead-letter source only after the broker accepted its copy.

    :param broker: ``kafka``, ``sqs``, ``pubsub`` or ``servicebus``.
    :param source: where messages go back to: the Kafka topic (optional: each record's origin
        header otherwise), the SQS source queue URL, the Pub/Sub topic, the Service Bus entity
        (``<queue>`` or ``<topic>/Subscriptions/<subscription>``).
    :param dead_letter: where they are: the Kafka dead-letter topic, the SQS dead-letter queue
        URL, the Pub/Sub dead-letter subscription (Service Bus: the entity's own sub-queue).
    :param conn_id: the Airflow connection (the triggers' default for the broker if not given).
    :param filter: a JMESPath expression over the envelope the triggers see; only messages it
        selects are moved.
    :param max_messages: move at most this many (blank or ``None``: ``DEFAULT_MAX_MESSAGES``, 100).
        A redrive also never reads past the snapshot it takes when it starts (docs/redrive.rst).
    :param dry_run: count and sample what would move; copy nothing, remove nothing.
    :param keep_origin_attributes: keep the attributes our dead-lettering added (reason, origin).
    :param broker_options: ``group_id`` (Kafka), ``region_name`` (SQS), ``project_id``
        (Pub/Sub), ``lease_seconds`` (SQS, Pub/Sub).
    :param require_grant: refuse to run unless ``grant`` is the Streams page's signed grant for
        this run, its triggering user and these broker, connection and addresses
        (:mod:`airflow_shared_stream.redrive_grant`). On when the addresses come from a run's conf.
    :param grant: the grant (the redrive Dag's ``grant`` param, which the page fills).
    :return: (XCom) ``{"examined", "moved", "skipped", "failed", "left", "snapshot", "dry_run",
        "samples", "broker", "source"}``.
    """

    template_fields: Sequence[str] = (
        "broker",
        "source",
        "dead_letter",
        "conn_id",
        "filter",
        "max_messages",
        "is_dry_run",
        "keep_origin_attributes",
        "grant",
    )
    ui_color = "#f6e7d8"

    def __init__(
        self,
        *,
        broker: str,
        source: str | None = None,
        dead_letter: str | None = None,
        conn_id: str | None = None,
        filter: str | None = None,
        max_messages: int | str | None = None,
        dry_run: bool | str = False,
        keep_origin_attributes: bool | str = False,
        broker_options: dict[str, Any] | None = None,
        require_grant: bool = False,
        grant: str | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.broker = broker
        self.source = source
        self.dead_letter = dead_letter
        self.conn_id = conn_id
        self.filter = filter
        self.max_messages = max_messages
        self.is_dry_run = dry_run  # BaseOperator.dry_run is a method
        self.keep_origin_attributes = keep_origin_attributes
        self.broker_options = broker_options
        self.require_grant = require_grant
        self.grant = grant
        if not _templated(broker, filter, max_messages):  # fail at parse time where we can
            self._arguments()

    def _arguments(self) -> tuple[DeadLetterSource, str | None, int, bool]:
        broker = str(self.broker or "").strip().lower()
        compile_filter(self.filter or None)
        source = dead_letter_source(
            broker,
            source=self.source,
            dead_letter=self.dead_letter,
            conn_id=self.conn_id,
            keep_origin_attributes=_flag("keep_origin_attributes", self.keep_origin_attributes),
            broker_options=self.broker_options,
        )
        return source, self.filter or None, _count(self.max_messages), _flag("dry_run", self.is_dry_run)

    def execute(self, context: Any) -> dict[str, Any]:
        if self.require_grant:
            self._check_grant(context)
        source, expression, max_messages, dry_run = self._arguments()
        summary = asyncio.run(redrive(source, filter=expression, max_messages=max_messages, dry_run=dry_run))
        self.log.info(
            "Redrive summary: examined=%d moved=%d skipped=%d failed=%d left=%s snapshot=%s dry_run=%s "
            "left_untouched=%d",
            summary.examined,
            summary.moved,
            summary.skipped,
            summary.failed,
            summary.left,
            summary.snapshot,
            summary.dry_run,
            summary.left_untouched,
        )
        return summary.as_dict()

    def _check_grant(self, context: Any) -> None:
        """
        Refuse a run the Streams page did not grant for this task instance, its triggering user
        and these addresses. The page binds the grant to the task instance just after Airflow
        created the run: a task that starts before that asks its run for the bound grant again.
        """
        dag_run = context["dag_run"]
        grant = self.grant
        deadline = time.monotonic() + grant_bind_wait_seconds()
        while True:
            try:
                stream = check_grant(
                    grant,
                    run_id=dag_run.run_id,
                    dag_id=dag_run.dag_id,
                    team=getattr(dag_run, "team_name", None),  # the Dag's bundle's team, from the api-server
                    triggering_user_name=getattr(dag_run, "triggering_user_name", None),
                    params={
                        "broker": str(self.broker or "").strip().lower(),
                        "conn_id": self.conn_id,
                        "source": self.source,
                        "dead_letter": self.dead_letter,
                    },
                    task_instance_id=str(context["ti"].id),
                )
            except GrantNotBoundError:
                if time.monotonic() >= deadline:
                    raise
                time.sleep(GRANT_BIND_POLL_SECONDS)
                grant = (_current_conf(dag_run.dag_id, dag_run.run_id) or {}).get(GRANT_PARAM)
                continue
            self.log.info("Redrive granted for stream %s", stream)
            return


def _current_conf(dag_id: str, run_id: str) -> dict[str, Any] | None:
    """The run's conf as the metadata database holds it now (through the task's execution API)."""
    from airflow.sdk.execution_time.comms import GetDagRun
    from airflow.sdk.execution_time.task_runner import SUPERVISOR_COMMS

    answer = SUPERVISOR_COMMS.send(GetDagRun(dag_id=dag_id, run_id=run_id))
    return getattr(answer, "conf", None)


def _templated(*values: Any) -> bool:
    return any(isinstance(v, str) and "{{" in v for v in values)
