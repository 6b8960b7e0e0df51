"""
The master web UI's driver listing, and finding a driver by the tag of its submission.

The master's and workers' web UIs are plain HTTP servers the ``JWSFilter`` does not protect: a
token sent there can be read by anyone who can read that traffic or those servers' access logs,
and it lets its holder run arbitrary code on the cluster. The clients here are built without it
(:func:`ui_client`, :func:`async_ui_client`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import httpx

from airflow_shared_stream.spark.config import SparkRestConfig
from airflow_shared_stream.spark.errors import SparkRestError, TransientSparkRestError, transport_error

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
        raise transport_error(exc, "the driver listing") from None


async def amaster_state(http: httpx.AsyncClient, cfg: SparkRestConfig) -> MasterState:
    try:
        return _listing(await http.get(_master_json_url(cfg)))
    except httpx.HTTPError as exc:
        raise transport_error(exc, "the driver listing") from None


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
