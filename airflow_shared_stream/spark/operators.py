"""
``DeferrableSparkSubmitOperator``: ``SparkSubmitOperator`` that frees its worker slot while Spark runs.

A drop-in subclass: same arguments, same ``spark`` connection. With ``deferrable=True`` and a
single standalone master in cluster mode (``spark://host:port`` with ``deploy-mode: cluster``)
it submits through the master's REST API, stores the submission id in the task state store,
and defers to :class:`~airflow_shared_stream.spark.triggers.SparkApplicationTrigger`. Every
other case (``deferrable=False``, ``local[*]``, YARN, Kubernetes, HA master lists) runs the
parent's ``execute`` unchanged, so behaviour there is exactly ``SparkSubmitOperator``'s.

Why the REST API rather than ``spark-submit``: ``spark-submit --deploy-mode cluster`` refuses
Python applications on standalone, and a ``spark-submit`` process would have to stay alive on
the worker anyway. The REST create call returns at once with the driver id.
"""

from __future__ import annotations

import datetime as dt
import time
import uuid
from importlib import metadata
from typing import TYPE_CHECKING, Any

from airflow_shared_stream.common.errors import require_sdk

# Airflow's Spark provider comes with the `spark` extra (a Kafka-only deployment does not want
# pyspark-client, pandas and pyarrow); without it, say which extra to install.
require_sdk("airflow.providers.apache.spark", "spark")

from airflow.providers.apache.spark.operators.spark_submit import (  # noqa: E402 - after the check that names the extra
    SparkSubmitOperator,
)
from airflow.providers.common.compat.openlineage.utils.spark import (  # noqa: E402
    inject_parent_job_information_into_spark_properties,
    inject_transport_information_into_spark_properties,
)
from airflow.sdk import conf  # noqa: E402
from airflow.sdk.exceptions import (  # noqa: E402
    AirflowException,
    AirflowFailException,
    AirflowNotFoundException,
    AirflowTaskTimeout,
)

from airflow_shared_stream.spark.clients import SparkRestClient  # noqa: E402
from airflow_shared_stream.spark.config import SparkRestConfig, rest_submission_supported  # noqa: E402
from airflow_shared_stream.spark.errors import (  # noqa: E402
    SparkRestError,
    TransientSparkRestError,
    UnknownSubmissionError,
)
from airflow_shared_stream.spark.hook import SparkRestHook  # noqa: E402
from airflow_shared_stream.spark.master_ui import SUBMISSION_TAG_PROPERTY, find_driver_by_tag  # noqa: E402
from airflow_shared_stream.spark.rest import build_create_request, check_python_files_local  # noqa: E402
from airflow_shared_stream.spark.task_states import (  # noqa: E402
    TASK_INSTANCE_PROPERTY,
    TaskInstanceRef,
    deployment_identity,
)
from airflow_shared_stream.spark.triggers import (  # noqa: E402
    DEFAULT_MAX_TRANSIENT_ERRORS,
    SparkApplicationTrigger,
)

if TYPE_CHECKING:
    from airflow.sdk import Context

# SparkSubmitOperator arguments that only spark-submit itself can honour (client-side dependency
# resolution, Kerberos login, commands run after spark-submit, YARN). The REST path refuses them
# loudly instead of dropping them: a dropped login can change who the job runs as.
_SPARK_SUBMIT_ONLY = {
    "packages": "packages",
    "exclude_packages": "exclude_packages",
    "_repositories": "repositories",
    "keytab": "keytab",
    "principal": "principal",
    "proxy_user": "proxy_user",
    "_use_krb5ccache": "use_krb5ccache",
    "post_submit_commands": "post_submit_commands",
    "_num_executors": "num_executors",
    "_yarn_queue": "yarn_queue",
    "properties_file": "properties_file",
}


UNKNOWN_OUTCOME_CHOICES = ("fail", "resubmit")


def _spark_version() -> str:
    try:
        return metadata.version("pyspark")
    except metadata.PackageNotFoundError:
        return "4.0.0"


class DeferrableSparkSubmitOperator(SparkSubmitOperator):
    """
    ``SparkSubmitOperator`` with a deferrable mode for Spark standalone clusters.

    :param deferrable: submit over REST and wait in the triggerer (standalone cluster mode).
        Defaults to ``[operators] default_deferrable``.
    :param max_transient_errors: consecutive transient REST failures the trigger tolerates.
    :param on_unknown_outcome: what a retry does when an earlier attempt's application may have
        run but the master cannot say how it ended (its driver was evicted by
        ``spark.deploy.retainedDrivers`` or forgotten by a master restart without recovery; or a
        create went unanswered and the connection has no ``master-ui-url`` to look it up).
        ``"fail"`` (default) fails the task without retrying, naming the driver; ``"resubmit"``
        submits the application again, which may run it twice.

    Every other argument is ``SparkSubmitOperator``'s. In deferrable mode ``status_poll_interval``
    is the trigger's poll interval and ``execution_timeout`` is enforced by the trigger, which
    kills the driver when it passes. Connection extras used by the REST path:
    ``rest-port``, ``rest-scheme``, ``pyspark-driver-python`` (the parent-death launcher),
    ``pyspark-python``, ``master-ui-url`` (the shared status poller, failed drivers' messages,
    finding the driver of a create whose answer was lost); the password is the JWS token,
    sent only to the REST server (docs/spark.rst).
    """

    def __init__(
        self,
        *,
        deferrable: bool = conf.getboolean("operators", "default_deferrable", fallback=False),
        max_transient_errors: int = DEFAULT_MAX_TRANSIENT_ERRORS,
        on_unknown_outcome: str = "fail",
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        if on_unknown_outcome not in UNKNOWN_OUTCOME_CHOICES:
            raise ValueError(f"on_unknown_outcome must be one of {', '.join(UNKNOWN_OUTCOME_CHOICES)}")
        self.deferrable = deferrable
        self.max_transient_errors = max_transient_errors
        self.on_unknown_outcome = on_unknown_outcome
        self._submission_id: str | None = None
        self._rest_config: SparkRestConfig | None = None

    # -- execution ---------------------------------------------------------------------------

    def execute(self, context: Context) -> None:
        if not self.deferrable:
            return super().execute(context)
        try:
            cfg = SparkRestHook(self._conn_id).get_config()
        except AirflowNotFoundException:
            # SparkSubmitHook treats a missing connection as "yarn"; so does this operator.
            self.log.warning("Connection %s not found: running as SparkSubmitOperator", self._conn_id)
            return super().execute(context)
        if not rest_submission_supported(cfg, self._deploy_mode):
            self.log.warning(
                "Deferrable mode needs a single spark:// standalone master in cluster deploy mode; "
                "running as SparkSubmitOperator"
            )
            return super().execute(context)
        self._rest_config = cfg
        self._check_rest_arguments()
        with SparkRestClient(cfg) as client:
            submission_id, finished = self._reattach(client, context)
            if finished:
                return None  # a retry after the driver already succeeded: nothing left to do
            if submission_id is None:
                submission_id = self._submit(client, context)
        self._submission_id = submission_id
        self.defer(
            trigger=SparkApplicationTrigger(
                submission_id=submission_id,
                conn_id=self._conn_id,
                poll_interval=float(self._status_poll_interval or 1),
                deadline=self._deadline(context),
                max_transient_errors=self.max_transient_errors,
            ),
            method_name="execute_complete",
        )

    def _check_rest_arguments(self) -> None:
        """Refuse, before any request, what the REST path would drop or the cluster cannot run."""
        used = [arg for attr, arg in _SPARK_SUBMIT_ONLY.items() if getattr(self, attr, None)]
        if used:
            raise ValueError(
                f"{', '.join(used)} cannot be honoured when submitting over the standalone REST API; "
                "use deferrable=False"
            )
        if self.application.endswith(".py"):
            check_python_files_local(self.application, self.py_files)

    @property
    def _pending_key(self) -> str:
        """Task-state key of a create request sent but not (yet) answered: ``{"tag", "since"}``."""
        return f"{self.external_id_key}_pending"

    def _store(self, context: Context) -> Any:
        return context.get("task_state_store") if self.durable else None

    def _reattach(self, client: SparkRestClient, context: Context) -> tuple[str | None, bool]:
        """
        What a retry does with the driver id an earlier attempt stored: ``(id to wait on, finished)``.

        Still running: wait on it (no second copy of the job). Finished: nothing to do. Failed or
        killed: ``(None, False)``, submit anew. Unknown to the master (evicted, or the master
        restarted without recovery): it may have succeeded, so :meth:`_unknown_outcome` decides.
        An earlier create that was never answered is looked up by its tag first
        (:meth:`_resolve_pending`).
        """
        store = self._store(context)
        stored = store.get(self.external_id_key) if store is not None else None
        if not stored and store is not None:
            stored = self._resolve_pending(store)
        if not stored:
            return None, False
        try:
            status = client.status(str(stored))
        except UnknownSubmissionError:
            self._unknown_outcome(
                f"The Spark master no longer knows driver {stored} of an earlier attempt: it was "
                "evicted from the completed drivers the master keeps (spark.deploy.retainedDrivers) "
                "or the master restarted without recovery, so whether it succeeded is unknown"
            )
            return None, False
        if status.active:
            self.log.info("Reattaching to Spark driver %s (%s) instead of resubmitting", stored, status.state)
            return str(stored), False
        if status.succeeded:
            self.log.info("Spark driver %s already finished: not resubmitting", stored)
            return str(stored), True
        self.log.warning("Stored Spark driver %s ended %s: submitting anew", stored, status.state)
        return None, False

    def _resolve_pending(self, store: Any) -> str | None:
        """
        Find the driver of a create request whose answer was lost (timeout, reset, crash).

        The master may have started the driver although the client never heard back; submitting
        again would run the application twice. The tag the request carried identifies it.
        Returns the driver id (also stored under ``spark_job_id``), or ``None`` when the master
        has no driver with the tag (the request never got there): then submitting is safe.
        """
        pending = store.get(self._pending_key)
        if not isinstance(pending, dict) or not pending.get("tag"):
            return None
        cfg = self._rest_config
        assert cfg is not None
        if not cfg.master_ui_url:
            self._unknown_outcome(
                "An earlier create request of this task was not answered and the connection has no "
                "master-ui-url to look its driver up, so whether the application started is unknown"
            )
            store.delete(self._pending_key)
            return None
        found = self._find_tagged(cfg, str(pending["tag"]), float(pending.get("since") or 0))
        if found is None:
            self.log.info("The unanswered create request of an earlier attempt started no driver")
        else:
            self.log.info("Found driver %s of an earlier attempt's unanswered create request", found)
            store.set(self.external_id_key, found)
        store.delete(self._pending_key)
        return found

    def _unknown_outcome(self, why: str) -> None:
        """
        An earlier attempt's application may have run: resubmit only if the user said so.

        Retrying cannot make the master remember, so ``"fail"`` fails the task for good.
        """
        if self.on_unknown_outcome == "resubmit":
            self.log.warning("%s; submitting anew (on_unknown_outcome='resubmit'): it may run twice", why)
            return
        raise AirflowFailException(
            f"{why}. Not submitting it again: it may have run. Check its output, then either set "
            f"on_unknown_outcome='resubmit' or delete {self.external_id_key!r} (and "
            f"{self._pending_key!r}) from this task instance's state store, and clear the task"
        )

    def _find_tagged(self, cfg: SparkRestConfig, tag: str, since: float, wait: float = 60.0) -> str | None:
        """:func:`find_driver_by_tag`, waiting (bounded) for candidates that have not launched yet."""
        until = time.monotonic() + wait
        while True:
            lookup = find_driver_by_tag(cfg, tag, since)
            if lookup.driver_id or not lookup.undecided:
                return lookup.driver_id
            if time.monotonic() >= until:
                raise AirflowException(
                    f"Cannot tell whether Spark driver(s) {', '.join(lookup.undecided)} were started by an "
                    "earlier, unanswered create request of this task (not launched yet, or worker UI "
                    "unreachable); not submitting again. The task will retry."
                )
            time.sleep(2.0)

    def _lookup_after_lost_answer(self, cfg: SparkRestConfig, tag: str, since: float) -> str | None:
        if not cfg.master_ui_url:
            return None
        try:
            return self._find_tagged(cfg, tag, since)
        except (SparkRestError, AirflowException) as exc:
            self.log.warning("Could not look up the driver of the unanswered create request: %s", exc)
            return None

    def _submit(self, client: SparkRestClient, context: Context) -> str:
        spark_conf = dict(self.conf or {})
        if self._openlineage_inject_parent_job_info:
            spark_conf = inject_parent_job_information_into_spark_properties(spark_conf, context)
        if self._openlineage_inject_transport_info:
            spark_conf = inject_transport_information_into_spark_properties(spark_conf, context)
        cfg = self._rest_config
        assert cfg is not None
        if not (spark_conf.get("spark.pyspark.driver.python") or cfg.driver_python):
            self.log.warning(
                "No spark.pyspark.driver.python launcher configured: a killed driver's Python process "
                "may outlive it (set the connection extra pyspark-driver-python, docs/spark.rst)"
            )
        body = build_create_request(
            application=self.application,
            master_url=cfg.master_url,
            spark_version=_spark_version(),
            application_args=self.application_args,
            conf=spark_conf,
            name=self.name,
            java_class=self._java_class,
            py_files=self.py_files,
            files=self.files,
            jars=self.jars,
            archives=self._archives,
            driver_class_path=self.driver_class_path,
            driver_memory=self._driver_memory,
            executor_memory=self._executor_memory,
            executor_cores=self._executor_cores,
            total_executor_cores=self._total_executor_cores,
            env_vars=self.env_vars,
            driver_python=cfg.driver_python,
            python=cfg.python,
        )
        # The tag makes the create idempotent: if the answer is lost, the driver it started can
        # still be found (by this attempt, or by a retry via the pending marker).
        tag = uuid.uuid4().hex
        body["sparkProperties"][SUBMISSION_TAG_PROPERTY] = tag
        ti = context.get("ti")
        if ti is not None:  # lets a triggerer that did not run its trigger kill an orphan
            body["sparkProperties"][TASK_INSTANCE_PROPERTY] = TaskInstanceRef.of(
                ti, deployment_identity()
            ).encode()
        store = self._store(context)
        if store is not None:
            store.set(self._pending_key, {"tag": tag, "since": time.time()})
        since = time.time()
        try:
            submission_id = client.create(body)
        except TransientSparkRestError:
            # Timeout, reset or 5xx: the master may have accepted it all the same.
            found = self._lookup_after_lost_answer(cfg, tag, since)
            if found is None:
                raise  # the pending marker stays: a retry looks again before submitting
            self.log.warning("The create request was not answered, but the master started driver %s", found)
            submission_id = found
        except SparkRestError:
            if store is not None:  # a definite refusal: nothing was started
                store.delete(self._pending_key)
            raise
        self.log.info("Submitted Spark application %s as driver %s", self.name, submission_id)
        if store is not None:
            store.set(self.external_id_key, submission_id)
            store.delete(self._pending_key)
        return submission_id

    def _deadline(self, context: Context) -> float | None:
        if self.execution_timeout is None:
            return None
        ti = context.get("ti")
        start = getattr(ti, "start_date", None)
        started = start.timestamp() if isinstance(start, dt.datetime) else time.time()
        return started + self.execution_timeout.total_seconds()

    def execute_complete(self, context: Context, event: dict[str, Any]) -> None:
        """Resume on a worker with the trigger's event: succeed on FINISHED, fail otherwise."""
        status = event.get("status")
        message = event.get("message") or f"Spark driver {event.get('submission_id')}: {status}"
        if status == "success":
            self.log.info("%s", message)
            return None
        if status == "timeout":
            raise AirflowTaskTimeout(message)
        raise AirflowException(message)

    def on_kill(self) -> None:
        """Kill the REST-submitted driver if this process submitted one; else the parent's on_kill."""
        if self._submission_id and self._rest_config is not None:
            with SparkRestClient(self._rest_config) as client:
                client.kill(self._submission_id)
            return
        super().on_kill()
