"""
The master's REST submission API: the create request, and what its answers mean.

The operator (a worker, synchronous) and the trigger (the triggerer, asynchronous) talk to the
same three endpoints of the master's REST submission server::

    POST /v1/submissions/create          -> submissionId (the driver id)
    GET  /v1/submissions/status/<id>     -> driverState (SUBMITTED, RUNNING, FINISHED, ...)
    POST /v1/submissions/kill/<id>

Pure functions, so both clients (:mod:`.clients`) share them and unit tests need no cluster.
"""

from __future__ import annotations

import logging
import posixpath
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import httpx

from airflow_shared_stream.spark.errors import (
    SparkRestAuthError,
    SparkRestError,
    TransientSparkRestError,
    UnknownSubmissionError,
)

log = logging.getLogger(__name__)

PYTHON_RUNNER = "org.apache.spark.deploy.PythonRunner"

ACTIVE_STATES = frozenset({"SUBMITTED", "RUNNING", "RELAUNCHING", "UNKNOWN"})
"""Driver states that may still change (``DriverState.scala``); ``UNKNOWN`` = master recovering."""
SUCCEEDED_STATES = frozenset({"FINISHED"})
FAILED_STATES = frozenset({"FAILED", "ERROR", "KILLED"})


def _csv(value: str | Sequence[str] | None) -> str | None:
    if value is None:
        return None
    if isinstance(value, str):
        return value
    return ",".join(value)


def _as_uri(path: str) -> str:
    return path if "://" in path or path.startswith("file:") else f"file:{path}"


_URI_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*):")
LOCAL_SCHEMES = frozenset({"file", "local"})
"""The only schemes ``PythonRunner.formatPath`` accepts (``Utils.nonLocalPaths``)."""


def check_python_files_local(application: str, py_files: str | Sequence[str] | None) -> None:
    """
    Refuse a Python application or ``py_files`` entry the standalone driver cannot read.

    On a standalone cluster the driver runs ``PythonRunner``, which reads only local files (no
    ``hdfs://``, ``s3a://``, ``http://``): a remote one starts a driver that fails at once. The
    driver runs on whichever worker the master picks, so the file must also be at that path on
    every worker; that cannot be checked from here.
    """
    extra = _csv(py_files)
    for path in [application, *(p for p in (extra or "").split(",") if p)]:
        match = _URI_SCHEME.match(path.strip())
        if match and match.group(1).lower() not in LOCAL_SCHEMES:
            raise ValueError(
                f"{path!r}: a PySpark application on a standalone cluster runs through PythonRunner, "
                "which reads only local files. Put the script (and its py_files) at the same path on "
                "every Spark worker (a shared mount, or an image) and pass that path"
            )


def build_create_request(
    *,
    application: str,
    master_url: str,
    spark_version: str,
    application_args: Sequence[Any] | None = None,
    conf: Mapping[str, Any] | None = None,
    name: str | None = None,
    java_class: str | None = None,
    py_files: str | None = None,
    files: str | None = None,
    jars: str | None = None,
    archives: str | None = None,
    driver_class_path: str | None = None,
    driver_memory: str | None = None,
    executor_memory: str | None = None,
    executor_cores: int | None = None,
    total_executor_cores: int | None = None,
    env_vars: Mapping[str, Any] | None = None,
    driver_python: str | None = None,
    python: str | None = None,
) -> dict[str, Any]:
    """
    The ``CreateSubmissionRequest`` that ``spark-submit --deploy-mode cluster`` would send.

    A ``.py`` application runs through ``PythonRunner`` (``spark-submit`` refuses Python apps in
    standalone cluster mode, the REST API does not): its arguments are the script, the
    comma-separated ``py_files`` and then the application's own arguments. Operator arguments
    become the Spark properties ``spark-submit`` would set for them; explicit ``conf`` wins.
    """
    is_python = application.endswith(".py")
    if not is_python and not java_class:
        raise ValueError("java_class is required for a JVM application submitted over the REST API")
    if is_python:
        check_python_files_local(application, py_files)
    props: dict[str, str] = {
        "spark.master": master_url,
        "spark.submit.deployMode": "cluster",
        "spark.driver.supervise": "false",
        "spark.app.name": name or posixpath.basename(application),
    }
    derived = {
        "spark.submit.pyFiles": _csv(py_files),
        "spark.files": _csv(files),
        "spark.jars": _csv(jars) if is_python else ",".join(x for x in (application, _csv(jars)) if x),
        "spark.archives": _csv(archives),
        "spark.driver.extraClassPath": driver_class_path,
        "spark.driver.memory": driver_memory,
        "spark.executor.memory": executor_memory,
        "spark.executor.cores": None if executor_cores is None else str(executor_cores),
        "spark.cores.max": None if total_executor_cores is None else str(total_executor_cores),
    }
    if is_python:
        derived["spark.pyspark.driver.python"] = driver_python
        derived["spark.pyspark.python"] = python
    props.update({k: v for k, v in derived.items() if v})
    props.update({str(k): str(v) for k, v in (conf or {}).items()})
    args = [str(a) for a in (application_args or [])]
    if is_python:
        app_resource = _as_uri(application)
        main_class = PYTHON_RUNNER
        args = [application, _csv(py_files) or "", *args]
    else:
        app_resource = _as_uri(application)
        main_class = str(java_class)
    env = {"SPARK_ENV_LOADED": "1", **{str(k): str(v) for k, v in (env_vars or {}).items()}}
    return {
        "action": "CreateSubmissionRequest",
        "appResource": app_resource,
        "mainClass": main_class,
        "appArgs": args,
        "clientSparkVersion": spark_version,
        "environmentVariables": env,
        "sparkProperties": props,
    }


@dataclass(frozen=True)
class DriverStatus:
    """One ``SubmissionStatusResponse``."""

    submission_id: str
    state: str
    message: str | None = None
    worker_id: str | None = None
    worker_host_port: str | None = None

    @property
    def active(self) -> bool:
        return self.state in ACTIVE_STATES

    @property
    def succeeded(self) -> bool:
        return self.state in SUCCEEDED_STATES

    @property
    def failed(self) -> bool:
        return self.state in FAILED_STATES


def _check_http(resp: httpx.Response, what: str) -> dict[str, Any]:
    if resp.status_code in (401, 403):
        raise SparkRestAuthError(
            f"Spark master refused {what} with HTTP {resp.status_code}: check the connection's JWS token"
        )
    if resp.status_code >= 500:
        raise TransientSparkRestError(f"Spark master answered {what} with HTTP {resp.status_code}")
    try:
        data = resp.json()
    except ValueError:
        raise SparkRestError(f"Spark master answered {what} with HTTP {resp.status_code}, not JSON") from None
    if not isinstance(data, dict):
        raise SparkRestError(f"Spark master answered {what} with unexpected JSON")
    if resp.status_code >= 400 and data.get("success") is not False:
        raise SparkRestError(
            f"Spark master answered {what} with HTTP {resp.status_code}: {data.get('message')}"
        )
    return data


def parse_create_response(resp: httpx.Response) -> str:
    data = _check_http(resp, "create")
    sid = data.get("submissionId")
    if not data.get("success") or not sid:
        raise SparkRestError(f"Spark master refused the submission: {data.get('message', 'no message')}")
    return str(sid)


_RECOVERING = re.compile(r"ALIVE state|not the active master|STANDBY|RECOVERING", re.IGNORECASE)


def parse_status_response(resp: httpx.Response, submission_id: str) -> DriverStatus:
    data = _check_http(resp, "status")
    if not data.get("success"):
        message = str(data.get("message") or "")
        if _RECOVERING.search(message):
            raise TransientSparkRestError(f"Spark master cannot answer for {submission_id} now: {message}")
        raise UnknownSubmissionError(
            f"Spark master does not know submission {submission_id}"
            + (f": {message}" if message else " (finished and forgotten, or never submitted there)")
        )
    return DriverStatus(
        submission_id=submission_id,
        state=str(data.get("driverState", "UNKNOWN")).upper(),
        message=data.get("message") or None,
        worker_id=data.get("workerId"),
        worker_host_port=data.get("workerHostPort"),
    )


def parse_kill_response(resp: httpx.Response, submission_id: str) -> bool:
    """True if the master accepted the kill (False: already finished or unknown)."""
    data = _check_http(resp, "kill")
    if not data.get("success"):
        log.info("Spark master did not kill %s: %s", submission_id, data.get("message"))
        return False
    return True
