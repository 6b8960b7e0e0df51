"""The REST API's clients: synchronous for the operator, asynchronous for the trigger."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import httpx

from airflow_shared_stream.spark.config import SparkRestConfig
from airflow_shared_stream.spark.driver_logs import summarize_driver_output
from airflow_shared_stream.spark.errors import SparkRestError, transport_error
from airflow_shared_stream.spark.master_ui import amaster_state, async_ui_client
from airflow_shared_stream.spark.rest import (
    DriverStatus,
    parse_create_response,
    parse_kill_response,
    parse_status_response,
)

log = logging.getLogger(__name__)


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
            raise transport_error(exc, action) from None

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
            raise transport_error(exc, action) from None

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
