"""
Spark standalone master REST API: connection settings, request bodies, status parsing, clients.

The operator (a worker, synchronous) and the trigger (the triggerer, asynchronous) talk to the
same three endpoints of the master's REST submission server::

    POST /v1/submissions/create          -> submissionId (the driver id)
    GET  /v1/submissions/status/<id>     -> driverState (SUBMITTED, RUNNING, FINISHED, ...)
    POST /v1/submissions/kill/<id>

Everything that is not I/O (parsing the connection, building the create body, classifying a
response) is a pure function here, so both clients share it and unit tests cover it without
a cluster.

Credentials: the REST server runs arbitrary code, so a production master protects it with
``spark.master.rest.filters=org.apache.spark.ui.JWSFilter``. The JWS the client must send as
``Authorization: Bearer`` is the connection's *password*. It lives only in
:class:`SparkRestConfig` (``repr`` hides it) and in the headers of requests to the REST server:
never in trigger kwargs, log lines or exception text, and never in requests to the master's or
a worker's web UI. Those are plain HTTP servers the ``JWSFilter`` does not protect; a token
sent there can be read by anyone who can read that traffic or those servers' access logs, and
it lets its holder run arbitrary code on the cluster. The web UI clients below are built
without it (:func:`ui_client`, :func:`async_ui_client`).
"""

from __future__ import annotations

import contextlib
import logging
import posixpath
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx
from airflow.sdk import BaseHook, Connection

log = logging.getLogger(__name__)

DEFAULT_REST_PORT = 6066
PYTHON_RUNNER = "org.apache.spark.deploy.PythonRunner"

ACTIVE_STATES = frozenset({"SUBMITTED", "RUNNING", "RELAUNCHING", "UNKNOWN"})
"""Driver states that may still change (``DriverState.scala``); ``UNKNOWN`` = master recovering."""
SUCCEEDED_STATES = frozenset({"FINISHED"})
FAILED_STATES = frozenset({"FAILED", "ERROR", "KILLED"})


class SparkRestError(Exception):
    """The master's REST API refused or failed a request (never carries the token)."""


class TransientSparkRestError(SparkRestError):
    """A failure worth retrying: connection refused/reset, timeout, HTTP 5xx, master recovering."""


class UnknownSubmissionError(SparkRestError):
    """The master does not know this submission id: polling it again would never end."""


class SparkRestAuthError(SparkRestError):
    """HTTP 401/403: missing, wrong or expired JWS token (a configuration error, not transient)."""


@dataclass(frozen=True)
class SparkRestConfig:
    """What a client needs to reach one standalone master; built from an Airflow Connection."""

    master_url: str
    """``spark://host:port`` of the master's RPC endpoint (what the driver connects to)."""
    rest_url: str
    """``http(s)://host:rest_port`` of the REST submission server."""
    deploy_mode: str | None = None
    token: str | None = field(default=None, repr=False)
    verify: bool = True
    timeout: float = 30.0
    driver_python: str | None = None
    """``spark.pyspark.driver.python`` default: the parent-death launcher on the Spark nodes."""
    python: str | None = None
    """``spark.pyspark.python`` default: the executors' interpreter on the Spark nodes."""
    master_ui_url: str | None = None
    """Master web UI base URL; when set, failed drivers' stderr is read for the error message."""

    @property
    def headers(self) -> dict[str, str]:
        """Headers for the REST submission server ONLY (they carry the JWS)."""
        headers = {"Content-Type": "application/json;charset=UTF-8"}
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        return headers


def _is_standalone_master(master: str) -> bool:
    return master.startswith("spark://") and "," not in master


def _host_of(master: str) -> str:
    """Host of the first master in ``scheme://host:port[,host:port]`` (no URL parser: ``local[2]``)."""
    hostport = master.split("://", 1)[-1].split(",")[0].split("/")[0]
    host = hostport.rsplit(":", 1)[0] if ":" in hostport else hostport
    return host or "localhost"


def config_from_connection(conn: Connection) -> SparkRestConfig:
    """
    Read a ``spark`` connection the way ``SparkSubmitHook`` does, plus the REST settings.

    Host may be ``spark://host`` or a bare host (then the connection type gives the scheme);
    the port is the master's RPC port. Extras: ``deploy-mode``, ``rest-port`` (default 6066),
    ``rest-scheme`` (``http``), ``rest-verify`` (TLS verification, default true),
    ``rest-timeout`` (seconds), ``pyspark-driver-python``, ``pyspark-python``,
    ``master-ui-url``. Password: the JWS token for ``JWSFilter``.
    """
    extra: Mapping[str, Any] = conn.extra_dejson or {}
    host = (conn.host or "").strip()
    # SparkSubmitHook's rule, so both operators read one connection the same way: a "spark"
    # connection's host is the whole master ("spark://h", "local[2]", "yarn") unless it is a bare
    # host with a port; other types (from a URI) give the scheme.
    if conn.conn_type == "spark" and host and ("://" in host or not conn.port):
        master = host
    else:
        master = f"{conn.conn_type or 'spark'}://{host}"
    if conn.port:
        master = f"{master}:{conn.port}"
    rest_host = _host_of(master)
    rest_scheme = str(extra.get("rest-scheme", "http"))
    rest_port = int(extra.get("rest-port", DEFAULT_REST_PORT))
    verify = extra.get("rest-verify", True)
    if isinstance(verify, str):
        verify = verify.strip().lower() not in ("false", "0", "no")
    return SparkRestConfig(
        master_url=master,
        rest_url=f"{rest_scheme}://{rest_host}:{rest_port}",
        deploy_mode=extra.get("deploy-mode"),
        token=conn.password or None,
        verify=bool(verify),
        timeout=float(extra.get("rest-timeout", 30.0)),
        driver_python=extra.get("pyspark-driver-python"),
        python=extra.get("pyspark-python"),
        master_ui_url=(extra.get("master-ui-url") or None),
    )


def rest_submission_supported(cfg: SparkRestConfig, deploy_mode: str | None) -> bool:
    """True for a single standalone master in cluster mode: the only target the REST path serves."""
    return _is_standalone_master(cfg.master_url) and (deploy_mode or cfg.deploy_mode) == "cluster"


def _mask(token: str | None) -> None:
    """Register the token with Airflow's secrets masker so no log line can show it."""
    if token:
        with contextlib.suppress(Exception):
            from airflow.sdk.log import mask_secret

            mask_secret(token)


class SparkRestHook(BaseHook):
    """
    Reads a ``spark`` connection for the master's REST API (see :func:`config_from_connection`).

    It reuses the ``spark`` connection type of apache-airflow-providers-apache-spark, so one
    ``spark_default`` serves both ``SparkSubmitOperator`` and the deferrable operator.
    """

    conn_name_attr = "conn_id"
    default_conn_name = "spark_default"
    conn_type = "spark"
    hook_name = "Spark (standalone REST)"

    def __init__(self, conn_id: str = default_conn_name) -> None:
        super().__init__()
        self.conn_id = conn_id

    def get_config(self) -> SparkRestConfig:
        cfg = config_from_connection(self.get_connection(self.conn_id))
        _mask(cfg.token)
        return cfg

    async def aget_config(self) -> SparkRestConfig:
        cfg = config_from_connection(await BaseHook.aget_connection(self.conn_id))
        _mask(cfg.token)
        return cfg


# ---------------------------------------------------------------------------------------------
# Request bodies


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


# ---------------------------------------------------------------------------------------------
# Responses


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


_JVM_EXCEPTION = re.compile(
    r"^(?:Caused by: |Exception in thread \"[^\"]*\" )?([\w.$]+(?:Error|Exception)(?::.*)?)$", re.MULTILINE
)


def _python_exception(text: str) -> str | None:
    idx = text.rfind("Traceback (most recent call last):")
    if idx < 0:
        return None
    for line in text[idx:].splitlines()[1:]:
        if line and not line.startswith((" ", "\t")):
            return line.strip()[:1000]
    return None


def summarize_driver_output(stdout: str, stderr: str = "") -> str | None:
    """
    The line a person wants from a failed driver: the last exception it raised.

    ``PythonRunner`` pipes the Python process's stdout and stderr into the driver's *stdout*
    file, so a Python traceback is looked for there first (then in stderr); failing that, the
    innermost JVM exception in stderr (the last ``Caused by:``).
    """
    found = _python_exception(stdout) or _python_exception(stderr)
    if found:
        return found
    matches = _JVM_EXCEPTION.findall(stderr)
    return matches[-1].strip()[:1000] if matches else None


def _transport_error(exc: httpx.HTTPError, what: str) -> TransientSparkRestError:
    # str(exc) names the URL at most; httpx never puts request headers in exception text.
    return TransientSparkRestError(f"Spark master unreachable for {what}: {type(exc).__name__}: {exc}")


# ---------------------------------------------------------------------------------------------
# The master's web UI (unprotected: never send the token there)

SUBMISSION_TAG_PROPERTY = "spark.airflow.submissionTag"
"""Spark property carrying the operator's per-submission tag (see :func:`tag_in_launch_command`).

Its name must not match ``spark.redaction.regex`` (``secret|password|token|...``), or the worker
would redact the value from the driver's launch command, where the tag is looked up."""


@dataclass(frozen=True)
class ListedDriver:
    """One driver in the master's JSON state."""

    driver_id: str
    state: str
    worker_id: str | None
    start_time_ms: int


@dataclass(frozen=True)
class MasterState:
    """The parts of the master web UI's ``/json/`` this provider reads."""

    status: str
    """``ALIVE``, or ``STANDBY``/``RECOVERING``/``COMPLETING_RECOVERY`` (cannot answer yet)."""
    drivers: dict[str, ListedDriver]
    """Active and retained completed drivers by id (``spark.deploy.retainedDrivers`` bounds it)."""
    worker_ui: dict[str, str]
    """Worker id -> its web UI address."""

    @property
    def alive(self) -> bool:
        return self.status == "ALIVE"


def parse_master_state(data: Any) -> MasterState:
    """Parse ``GET <master-ui>/json/``; raise :class:`SparkRestError` on anything else."""
    if not isinstance(data, dict) or "activedrivers" not in data:
        raise SparkRestError("Spark master web UI answered /json/ without a driver listing")
    drivers: dict[str, ListedDriver] = {}
    # Completed first: an id listed in both (a relaunch) takes its active entry.
    for entry in [*data.get("completeddrivers", []), *data.get("activedrivers", [])]:
        try:
            start = int(entry.get("starttime") or 0)
        except (TypeError, ValueError):
            start = 0
        drivers[str(entry["id"])] = ListedDriver(
            driver_id=str(entry["id"]),
            state=str(entry.get("state", "UNKNOWN")).upper(),
            worker_id=entry.get("worker") or None,
            start_time_ms=start,
        )
    workers = {str(w["id"]): str(w["webuiaddress"]) for w in data.get("workers", []) if w.get("webuiaddress")}
    return MasterState(status=str(data.get("status", "ALIVE")).upper(), drivers=drivers, worker_ui=workers)


def tag_in_launch_command(stderr_head: str, tag: str) -> bool:
    """
    True if a driver's stderr starts with a launch command carrying ``tag``.

    The worker writes ``Launch Command: "java" ... "-D<property>=<value>" ...`` at the top of
    every driver's stderr, with every Spark property of the submission: the only place outside
    the driver where a property the client chose can be read back.
    """
    return f'"-D{SUBMISSION_TAG_PROPERTY}={tag}"' in stderr_head


def _ui_client_kwargs(cfg: SparkRestConfig) -> dict[str, Any]:
    # Deliberately no cfg.headers: the web UIs are not behind the JWS filter.
    return {"verify": cfg.verify, "timeout": cfg.timeout, "follow_redirects": True}


def ui_client(cfg: SparkRestConfig) -> httpx.Client:
    """A synchronous client for the master's and workers' web UIs: no token."""
    return httpx.Client(**_ui_client_kwargs(cfg))


def async_ui_client(cfg: SparkRestConfig) -> httpx.AsyncClient:
    """An asynchronous client for the master's and workers' web UIs: no token."""
    return httpx.AsyncClient(**_ui_client_kwargs(cfg))


def _master_json_url(cfg: SparkRestConfig) -> str:
    if not cfg.master_ui_url:
        raise SparkRestError(
            "the connection has no master-ui-url: the master's driver listing is unavailable"
        )
    return f"{cfg.master_ui_url.rstrip('/')}/json/"


def _listing(resp: httpx.Response) -> MasterState:
    if resp.status_code >= 500:
        raise TransientSparkRestError(f"Spark master web UI answered /json/ with HTTP {resp.status_code}")
    if resp.status_code != 200:
        raise SparkRestError(f"Spark master web UI answered /json/ with HTTP {resp.status_code}")
    try:
        return parse_master_state(resp.json())
    except ValueError:
        raise SparkRestError("Spark master web UI answered /json/ with something other than JSON") from None


def master_state(http: httpx.Client, cfg: SparkRestConfig) -> MasterState:
    try:
        return _listing(http.get(_master_json_url(cfg)))
    except httpx.HTTPError as exc:
        raise _transport_error(exc, "the driver listing") from None


async def amaster_state(http: httpx.AsyncClient, cfg: SparkRestConfig) -> MasterState:
    try:
        return _listing(await http.get(_master_json_url(cfg)))
    except httpx.HTTPError as exc:
        raise _transport_error(exc, "the driver listing") from None


@dataclass(frozen=True)
class TagLookup:
    """Result of :func:`find_driver_by_tag`."""

    driver_id: str | None
    """The driver started with the tag, if one was found."""
    undecided: tuple[str, ...] = ()
    """Candidates whose launch command could not be read (not launched yet, worker UI down)."""


def find_driver_by_tag(cfg: SparkRestConfig, tag: str, since: float, *, skew: float = 300.0) -> TagLookup:
    """
    Find the driver a create request with ``tag`` started, if the master accepted it.

    Candidates are the drivers the master registered after ``since`` (minus ``skew`` for clock
    differences between the Airflow worker and the master), newest first; each launched one is
    identified by the tag in its launch command, read from its worker's web UI.
    """
    with ui_client(cfg) as http:
        state = master_state(http, cfg)
        candidates = sorted(
            (
                d
                for d in state.drivers.values()
                if d.start_time_ms == 0 or d.start_time_ms / 1000 >= since - skew
            ),
            key=lambda d: d.driver_id,
            reverse=True,
        )
        undecided = []
        for driver in candidates:
            ui = state.worker_ui.get(driver.worker_id or "")
            if not ui:
                undecided.append(driver.driver_id)
                continue
            try:
                resp = http.get(
                    f"{ui.rstrip('/')}/log/",
                    params={
                        "driverId": driver.driver_id,
                        "logType": "stderr",
                        "offset": 0,
                        "byteLength": 65536,
                    },
                )
            except httpx.HTTPError:
                undecided.append(driver.driver_id)
                continue
            if resp.status_code != 200 or "Launch Command" not in resp.text:
                undecided.append(driver.driver_id)
                continue
            if tag_in_launch_command(resp.text, tag):
                return TagLookup(driver.driver_id)
        return TagLookup(None, tuple(undecided))


# ---------------------------------------------------------------------------------------------
# Clients


class SparkRestClient:
    """Synchronous client (operator side, on a worker)."""

    def __init__(self, cfg: SparkRestConfig) -> None:
        self.cfg = cfg
        self._http = httpx.Client(
            base_url=cfg.rest_url, headers=cfg.headers, verify=cfg.verify, timeout=cfg.timeout
        )

    def __enter__(self) -> SparkRestClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self._http.close()

    def _request(self, method: str, path: str, action: str, **kwargs: Any) -> httpx.Response:
        try:
            return self._http.request(method, path, **kwargs)
        except httpx.HTTPError as exc:
            raise _transport_error(exc, action) from None

    def create(self, body: Mapping[str, Any]) -> str:
        return parse_create_response(
            self._request("POST", "/v1/submissions/create", "create", json=dict(body))
        )

    def status(self, submission_id: str) -> DriverStatus:
        resp = self._request("GET", f"/v1/submissions/status/{submission_id}", "status")
        return parse_status_response(resp, submission_id)

    def kill(self, submission_id: str) -> bool:
        resp = self._request("POST", f"/v1/submissions/kill/{submission_id}", "kill")
        return parse_kill_response(resp, submission_id)


class AsyncSparkRestClient:
    """Asynchronous client (trigger side, in the triggerer's event loop)."""

    def __init__(self, cfg: SparkRestConfig) -> None:
        self.cfg = cfg
        self._http = httpx.AsyncClient(
            base_url=cfg.rest_url, headers=cfg.headers, verify=cfg.verify, timeout=cfg.timeout
        )

    async def __aenter__(self) -> AsyncSparkRestClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._http.aclose()

    async def _request(self, method: str, path: str, action: str) -> httpx.Response:
        try:
            return await self._http.request(method, path)
        except httpx.HTTPError as exc:
            raise _transport_error(exc, action) from None

    async def status(self, submission_id: str) -> DriverStatus:
        resp = await self._request("GET", f"/v1/submissions/status/{submission_id}", "status")
        return parse_status_response(resp, submission_id)

    async def kill(self, submission_id: str) -> bool:
        resp = await self._request("POST", f"/v1/submissions/kill/{submission_id}", "kill")
        return parse_kill_response(resp, submission_id)

    async def driver_failure_summary(self, status: DriverStatus, max_bytes: int = 64 * 1024) -> str | None:
        """
        Best effort: the failed driver's last exception, read from its worker's web UI.

        Needs ``master-ui-url`` in the connection (to map the worker id to its UI). Any failure
        here returns ``None``: the task still fails with the driver's state. Neither web UI is
        behind the JWS filter, so neither request carries the token.
        """
        if not self.cfg.master_ui_url or not status.worker_id:
            return None
        try:
            async with async_ui_client(self.cfg) as http:
                ui = (await amaster_state(http, self.cfg)).worker_ui.get(status.worker_id)
                if not ui:
                    return None
                logs = {}
                for log_type in ("stdout", "stderr"):
                    resp = await http.get(
                        f"{ui.rstrip('/')}/log/",
                        params={
                            "driverId": status.submission_id,
                            "logType": log_type,
                            "byteLength": max_bytes,
                        },
                    )
                    logs[log_type] = resp.text if resp.status_code == 200 else ""
                return summarize_driver_output(logs["stdout"], logs["stderr"])
        except (httpx.HTTPError, SparkRestError, ValueError, AttributeError) as exc:
            log.info("Could not read driver %s stderr: %s", status.submission_id, type(exc).__name__)
            return None
