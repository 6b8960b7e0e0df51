"""
The console's routes: the page, the streams as JSON, and starting a redrive (api-server only).

Every route depends on Airflow's own security dependencies (``requires_access_dag``, which reads
the JWT from the ``Authorization`` header or Airflow's session cookie through ``get_user`` and
asks the configured auth manager), and then asks the auth manager about each stream's own Dags,
with their teams, as Airflow's REST API does (:mod:`.access`):

* ``GET /`` and ``GET /api/streams``: read access to Dags; a stream is listed to whoever may
  read one of its Dags, cut to the watchers of the Dags they may read;
* ``POST /api/streams/{id}/redrive``: the right to trigger every Dag of the stream and the
  redrive Dag of the stream's team (``shared_stream_redrive_dead_letters__<team>``, in a bundle of
  that team; the Dag of no team for a stream of no team), never a Dag of another team or of no
  team for a stream of a team: whoever may read a Dag reads its runs' conf and XCom. The page
  then signs a grant for the run it creates (:mod:`airflow_shared_stream.redrive_grant`),
  which the task checks at run time, and creates the run through Airflow's REST API with the
  user's own credential, so Airflow checks it again, and audits and logs it like any manual run;
  once created, it binds the grant to the run's task instance (a re-created run has another).
  That request goes to ``[api] base_url`` when it is absolute, else to the api-server's own
  ``[api] host`` and ``port``: never to the address the request's ``Host`` header names.

The stream's broker, connection id, source and dead-letter destination come from its watchers;
the person chooses only the filter, the count, dry run and the origin attributes. Every answer
carries ``Cache-Control: no-store``.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable, Mapping
from importlib import resources
from typing import Any

import httpx
from airflow.api_fastapi.auth.managers.base_auth_manager import COOKIE_NAME_JWT_TOKEN
from airflow.api_fastapi.core_api.security import GetUserDep, requires_access_dag
from fastapi import Depends, FastAPI, HTTPException, Request, Response
from fastapi.responses import HTMLResponse
from pydantic import BaseModel, Field, field_validator
from starlette.concurrency import run_in_threadpool

from airflow_shared_stream.console.access import (
    RedriveDag,
    dag_teams,
    may_trigger,
    read_redrive_dag,
    redrive_dag_of,
    redrive_refusal,
    shown_redrive_dag,
    stream_dags,
    visible_streams,
)
from airflow_shared_stream.console.backlog import broker_backlog
from airflow_shared_stream.console.streams import Stream, read_streams
from airflow_shared_stream.redrive_dag import REDRIVE_DAG_ID, REDRIVE_TASK_ID
from airflow_shared_stream.redrive_grant import GRANT_PARAM, bind_grant, sign_grant

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


def create_app() -> FastAPI:
    """The console's FastAPI app (built when the api-server loads its plugins)."""
    app = FastAPI(title="Shared streams", docs_url=None, redoc_url=None, openapi_url=None)

    @app.middleware("http")
    async def security_headers(
        request: Request, call_next: Callable[[Request], Awaitable[Response]]
    ) -> Response:
        response = await call_next(request)  # errors too: a refusal is no more cacheable than data
        for name, value in SECURITY_HEADERS.items():
            response.headers.setdefault(name, value)
        return response

    @app.get("/", response_class=HTMLResponse, dependencies=[can_read])
    def page() -> HTMLResponse:
        html = resources.files("airflow_shared_stream.console").joinpath("static/streams.html").read_text()
        return HTMLResponse(html)

    @app.get("/api/streams", dependencies=[can_read])
    async def streams(user: GetUserDep) -> dict[str, Any]:
        found, teams, redrive_dags = await run_in_threadpool(_read)
        # An auth manager may ask a database or a service: off the event loop, like the reads.
        shown, refusals, named, allowed = await run_in_threadpool(
            _authorize, found, user, teams, redrive_dags
        )
        backlogs = await asyncio.gather(*(broker_backlog(s.broker, s.producer_kwargs) for s in shown))
        result = [
            {
                **stream.to_json(),
                "backlog": backlog,
                "redrive_dag_id": redrive_dag_id,
                "redrive_refused": refused,
            }
            for stream, backlog, refused, redrive_dag_id in zip(shown, backlogs, refusals, named, strict=True)
        ]
        redrive_dag = redrive_dags[REDRIVE_DAG_ID]  # the Dag of no team; each stream names its own
        return {
            "streams": result,
            "redrive": {
                "dag_id": REDRIVE_DAG_ID,
                "deployed": redrive_dag.deployed,
                "paused": redrive_dag.paused,
                "allowed": allowed,
            },
        }

    # The right to trigger the redrive Dag is asked per stream, of its team's Dag (redrive_refusal).
    @app.post("/api/streams/{stream_id}/redrive", status_code=201, dependencies=[can_read])
    async def redrive(
        stream_id: str, body: RedriveRequest, request: Request, user: GetUserDep
    ) -> dict[str, Any]:
        found, teams, redrive_dags = await run_in_threadpool(_read)
        shown = await run_in_threadpool(visible_streams, found, user, teams)
        stream = next((s for s in shown if s.id == stream_id), None)
        if stream is None:  # another team's stream is as absent as one that does not exist
            raise HTTPException(404, f"No stream {stream_id!r}")
        refusal = await run_in_threadpool(redrive_refusal, stream, user, teams, redrive_dags)
        if refusal is not None:
            raise HTTPException(refusal.status, refusal.reason)
        redrive_dag = redrive_dags[str(redrive_dag_of(stream, teams))]  # the Dag redrive_refusal allowed
        run_id = f"shared_stream_redrive__{uuid.uuid4().hex}"
        grant = sign_grant(
            run_id=run_id,
            dag_id=redrive_dag.dag_id,
            team=redrive_dag.team,
            user_name=user.get_name(),
            stream_id=stream.id,
            params=stream.redrive_params,
        )
        params = {**stream.redrive_params, **body.params()}
        async with httpx.AsyncClient(base_url=airflow_api_root(), timeout=30) as client:
            answer = await client.post(
                f"/api/v2/dags/{redrive_dag.dag_id}/dagRuns",
                json={
                    "dag_run_id": run_id,
                    "logical_date": None,
                    "conf": {**params, GRANT_PARAM: grant},
                    "note": f"Redrive of stream {stream.id}",
                },
                headers={"Authorization": f"Bearer {_credential(request)}"},
            )
        if answer.status_code >= 400:
            detail = answer.json().get("detail") if "json" in answer.headers.get("content-type", "") else None
            raise HTTPException(answer.status_code, detail or "Airflow refused to create the run")
        await run_in_threadpool(_bind_grant, redrive_dag.dag_id, run_id, grant)
        return {"dag_id": redrive_dag.dag_id, "dag_run_id": answer.json().get("dag_run_id"), "conf": params}

    return app


def _authorize(
    found: list[Stream], user: Any, teams: Mapping[str, str | None], redrive_dags: Mapping[str, RedriveDag]
) -> tuple[list[Stream], list[str | None], list[str | None], bool]:
    """
    The streams this user sees, why each may not be redriven by them, the redrive Dag each is
    named with (none when it would name the team of a Dag hidden from them), and the no-team
    Dag's right.
    """
    shown = visible_streams(found, user, teams)
    refusals = [redrive_refusal(stream, user, teams, redrive_dags) for stream in shown]
    named = [shown_redrive_dag(stream, user, teams) for stream in shown]
    redrive_dag = redrive_dags[REDRIVE_DAG_ID]
    allowed = may_trigger(user, redrive_dag.dag_id, redrive_dag.team)
    return shown, [r.reason if r else None for r in refusals], named, allowed


def _read() -> tuple[list[Stream], dict[str, str | None], dict[str, RedriveDag]]:
    """The streams, their Dags' teams, and the redrive Dags they need (the no-team one always)."""
    from airflow.utils.session import create_session

    with create_session() as session:
        found = read_streams(session)
        teams = dag_teams(session, {d for s in found for d in stream_dags(s) | set(s.hidden_dags)})
        wanted = {REDRIVE_DAG_ID} | {d for s in found if (d := redrive_dag_of(s, teams)) is not None}
        return found, teams, {d: read_redrive_dag(session, d) for d in sorted(wanted)}


def _bind_grant(dag_id: str, run_id: str, grant: str) -> None:
    """
    Bind the grant in the run the page just created to that run's redrive task instance
    (:func:`airflow_shared_stream.redrive_grant.bind_grant`): a run deleted and created again under
    its run id with the conf copied has another task instance, and its task refuses the grant.
    Only a conf still holding the page's own grant is rewritten.
    """
    from airflow.models.dagrun import DagRun
    from airflow.models.taskinstance import TaskInstance
    from airflow.utils.session import create_session
    from sqlalchemy import select

    with create_session() as session:
        run = session.scalar(
            select(DagRun).where(DagRun.dag_id == dag_id, DagRun.run_id == run_id).with_for_update()
        )
        task_instance_id = session.scalar(
            select(TaskInstance.id).where(
                TaskInstance.dag_id == dag_id,
                TaskInstance.run_id == run_id,
                TaskInstance.task_id == REDRIVE_TASK_ID,
                TaskInstance.map_index == -1,
            )
        )
        if run is None or task_instance_id is None or (run.conf or {}).get(GRANT_PARAM) != grant:
            raise HTTPException(
                409, f"the redrive run {run_id!r} changed before its grant was bound: start it again"
            )
        run.conf = {**run.conf, GRANT_PARAM: bind_grant(grant, str(task_instance_id))}


def _credential(request: Request) -> str:
    """The credential this request was authenticated with (the header first, as ``get_user`` reads)."""
    header = request.headers.get("authorization", "")
    if header.lower().startswith("bearer "):
        return header[7:]
    return request.cookies.get(COOKIE_NAME_JWT_TOKEN, "")


def airflow_api_root() -> str:
    """
    Where Airflow's REST API answers, from configuration only: ``[api] base_url`` if absolute,
    else this api-server's ``[api] host`` and ``port`` (with ``base_url``'s path). Never the
    request's ``Host`` header: a forged one would receive the user's token.
    """
    from urllib.parse import urlsplit

    from airflow.configuration import conf

    configured = (conf.get("api", "base_url", fallback="") or "").strip()
    if configured.startswith(("http://", "https://")):
        return configured.rstrip("/")
    host = conf.get("api", "host", fallback="") or ""
    if host in ("", "0.0.0.0", "::"):
        host = "127.0.0.1"
    elif ":" in host:
        host = f"[{host}]"
    scheme = "https" if conf.get("api", "ssl_cert", fallback="") else "http"
    path = urlsplit(configured).path.rstrip("/") if configured else ""
    return f"{scheme}://{host}:{conf.getint('api', 'port', fallback=8080)}{path}"
