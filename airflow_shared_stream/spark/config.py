"""
The connection settings of the Spark REST path, read from a ``spark`` Airflow Connection.

Credentials: the REST server runs arbitrary code, so a production master protects it with
``spark.master.rest.filters=org.apache.spark.ui.JWSFilter``. The JWS the client must send as
``Authorization: Bearer`` is the connection's *password*. It lives only in
:class:`SparkRestConfig` (``repr`` hides it) and in the headers of requests to the REST server:
never in trigger kwargs, log lines or exception text, and never in requests to a web UI
(:mod:`.master_ui`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from airflow.sdk import Connection

DEFAULT_REST_PORT = 6066


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
