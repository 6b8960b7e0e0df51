"""
The console's routes: the page, the streams as JSON, and starting a redrive (api-server only).

Every route depends on Airflow's own security dependencies (``requires_access_dag``, which reads
the JWT from the ``Authorization`` header or Airflow's session cookie through ``get_user`` and
asks the configured auth manager):

* ``GET /`` and ``GET /api/streams``: read access to Dags;
* ``POST /api/streams/{id}/redrive``: the right to create runs of the redrive Dag. The run is
  then created through Airflow's REST API with the user's own credential, so Airflow checks it
  again, and audits and logs the run like any manual one.

The stream's broker, connection id, source and dead-letter destination come from its watchers;
the person chooses only the filter, the count, dry run and the origin attributes.
"""

from __future__ import annotations

import asyncio
from importlib import resources
from typing import Any

import httpx
from airflow.api_fastapi.auth.managers.base_auth_manager import COOKIE_NAME_JWT_TOKEN
from airflow.api_fastapi.auth.managers.models.resource_details import DagAccessEntity, DagDetails
from airflow.api_fastapi.core_api.security import GetUserDep, requires_access_dag
from fastapi import Depends, FastAPI, HTTPException, Request
from fastapi.responses import HTMLResponse
from pydantic import BaseModel, Field, field_validator
from starlette.concurrency import run_in_threadpool

from airflow_shared_stream.console.backlog import broker_backlog
from airflow_shared_stream.console.plugin import REDRIVE_DAG_ID
from airflow_shared_stream.console.streams import Stream, read_streams

MAX_REDRIVE_MESSAGES = 100_000
SECURITY_HEADERS = {
    "Cache-Control": "no-store",
    "X-Frame-Options": "SAMEORIGIN",
    "X-Content-Type-Options": "nosniff",
    "Content-Security-Policy": "default-src 'self'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; "
    "img-src 'self' data:; frame-ancestors 'self'",
}


class RedriveRequest(BaseModel):
    """What the person chooses; the stream's broker, connection and queues come from its watchers."""

    filter: str | None = Field(default=None, max_length=2000)
    max_messages: int | None = Field(default=None, ge=1, le=MAX_REDRIVE_MESSAGES)
    dry_run: bool = True
    keep_origin_attributes: bool = False

    @field_validator("filter")
    @classmethod
    def _filter_compiles(cls, value: str | None) -> str | None:
        """A filter the redrive would refuse is refused here, with its reason (a 422)."""
        from airflow_shared_stream.common.redrive import compile_filter

        compile_filter(value or None)
        return value or None

    def params(self) -> dict[str, Any]:
        """The Dag run's conf: a field left blank is not sent, so the Dag's default applies."""
        return self.model_dump(exclude_none=True)


can_read = Depends(requires_access_dag("GET"))
can_redrive = Depends(requires_access_dag("POST", DagAccessEntity.RUN, param_dag_id=REDRIVE_DAG_ID))


def create_app() -> FastAPI:
    """The console's FastAPI app (built when the api-server loads its plugins)."""
    app = FastAPI(title="Shared streams", docs_url=None, redoc_url=None, openapi_url=None)

    @app.get("/", response_class=HTMLResponse, dependencies=[can_read])
    def page() -> HTMLResponse:
        html = resources.files("airflow_shared_stream.console").joinpath("static/streams.html").read_text()
        return HTMLResponse(html, headers=SECURITY_HEADERS)

    @app.get("/api/streams", dependencies=[can_read])
    async def streams(user: GetUserDep) -> dict[str, Any]:
        from airflow.api_fastapi.app import get_auth_manager

        found, deployed = await run_in_threadpool(_read)
        allowed = get_auth_manager().is_authorized_dag(
            method="POST", access_entity=DagAccessEntity.RUN, details=DagDetails(id=REDRIVE_DAG_ID), user=user
        )
        backlogs = await asyncio.gather(*(broker_backlog(s.broker, s.producer_kwargs) for s in found))
        result = [
            {**stream.to_json(), "backlog": backlog} for stream, backlog in zip(found, backlogs, strict=True)
        ]
        return {
            "streams": result,
            "redrive": {"dag_id": REDRIVE_DAG_ID, "deployed": deployed, "allowed": bool(allowed)},
        }

    @app.post("/api/streams/{stream_id}/redrive", status_code=201, dependencies=[can_redrive])
    async def redrive(stream_id: str, body: RedriveRequest, request: Request) -> dict[str, Any]:
        found, _ = await run_in_threadpool(_read)
        stream = next((s for s in found if s.id == stream_id), None)
        if stream is None:
            raise HTTPException(404, f"No stream {stream_id!r}")
        if not stream.redrive_params:
            raise HTTPException(409, f"Stream {stream_id!r} has no dead-letter destination to redrive from")
        params = {**stream.redrive_params, **body.params()}
        async with httpx.AsyncClient(base_url=_airflow_api_root(request), timeout=30) as client:
            answer = await client.post(
                f"/api/v2/dags/{REDRIVE_DAG_ID}/dagRuns",
                json={"logical_date": None, "conf": params, "note": f"Redrive of stream {stream.id}"},
                headers={"Authorization": f"Bearer {_credential(request)}"},
            )
        if answer.status_code >= 400:
            detail = answer.json().get("detail") if "json" in answer.headers.get("content-type", "") else None
            raise HTTPException(answer.status_code, detail or "Airflow refused to create the run")
        return {"dag_id": REDRIVE_DAG_ID, "dag_run_id": answer.json().get("dag_run_id"), "conf": params}

    return app


def _read() -> tuple[list[Stream], bool]:
    from airflow.utils.session import create_session

    with create_session() as session:
        return read_streams(session), _redrive_dag_deployed(session)


def _redrive_dag_deployed(session: Any) -> bool:
    from airflow.models.dag import DagModel
    from sqlalchemy import select

    return bool(
        session.scalar(
            select(DagModel.dag_id).where(DagModel.dag_id == REDRIVE_DAG_ID, DagModel.is_stale.is_(False))
        )
    )


def _credential(request: Request) -> str:
    """The credential this request was authenticated with (the header first, as ``get_user`` reads)."""
    header = request.headers.get("authorization", "")
    if header.lower().startswith("bearer "):
        return header[7:]
    return request.cookies.get(COOKIE_NAME_JWT_TOKEN, "")


def _airflow_api_root(request: Request) -> str:
    """Where Airflow's REST API answers: ``[api] base_url`` if absolute, else the address asked."""
    from airflow.configuration import conf

    configured = conf.get("api", "base_url", fallback="") or ""
    if configured.startswith(("http://", "https://")):
        return configured.rstrip("/")
    return f"{request.url.scheme}://{request.url.netloc}"
