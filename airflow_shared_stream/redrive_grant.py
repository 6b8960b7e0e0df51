"""
The grant that lets a run of the redrive Dag move one stream's dead letters, checked at run time.

Whoever may trigger the redrive Dag can write any conf, so its params (connection id, queues)
cannot be trusted by themselves. The Streams page decides who may redrive a stream, at the one
moment the person's rights can be asked of the auth manager (their request to the api-server:
an auth manager authorizes a user object, and a task sees only a user *name*, nor may a task
read the stream registry in the metadata database). Having decided, the page signs what it
decided: the run id it creates, the redrive Dag it creates it in and that Dag's team, the user,
the stream and its broker, connection, source and dead-letter destination. The task checks that
signature against its own run: its run id and Dag, the team Airflow gives the run (the team of
the Dag's bundle, from the api-server, never from conf), the ``triggering_user_name`` Airflow
recorded from the authenticated caller (never from conf) and the addresses it is about to use.
A conf written by hand, copied from another run or Dag or edited after signing is refused before
anything is read.

A run id names no one run: a run deleted and triggered again under its run id, with the conf
copied, has the same Dag, team, user and addresses. So once Airflow created the run, the page binds
the grant to the id of the run's redrive task instance (a random UUID the metadata database gives
the task instance when the run is created, and a new one at each retry or clear), rewriting the
run's conf in the metadata database (:func:`bind_grant`); the task refuses a grant bound to another
task instance than its own, or never bound. A re-created run, a cleared task or a conf copied
anywhere else has another task instance id, which no one but the page can sign for.

The key is Airflow's ``[api] secret_key``, which every component already shares (the api-server
signs with it, workers check log requests with it); it never leaves the deployment.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from airflow_shared_stream.common.errors import SharedStreamError

GRANT_PARAM = "grant"
"""The redrive Dag's param the page puts the signed grant in."""
GRANT_MAX_AGE_SECONDS = 24 * 3600
"""A grant older than this is refused: a run queued for a day is started again from the page."""
GRANTED_FIELDS = ("broker", "conn_id", "source", "dead_letter")
"""What a grant fixes: the stream's own params, never the person's choices (filter, count, flags)."""
TASK_INSTANCE_FIELD = "task_instance"
"""The grant's field naming the one task instance (its id) that may use it (:func:`bind_grant`)."""
_SALT = "airflow-shared-stream.redrive-grant.v1"


class RedriveNotGrantedError(SharedStreamError, PermissionError):
    """A redrive run without a valid grant for what it would move (see docs/redrive.rst)."""


class GrantNotBoundError(RedriveNotGrantedError):
    """A grant the page has not (yet) bound to the run's task instance: the task asks its run again."""


def _serializer() -> Any:
    from airflow.configuration import conf
    from itsdangerous import URLSafeTimedSerializer

    key = conf.get("api", "secret_key", fallback="") or ""
    if not key:
        raise RedriveNotGrantedError(
            "[api] secret_key is not set: the redrive grant cannot be signed or checked "
            "(every component needs the api-server's secret_key)"
        )
    return URLSafeTimedSerializer(key, salt=_SALT)


def granted_params(params: Mapping[str, Any]) -> dict[str, str | None]:
    """The fields a grant fixes, each as text or ``None`` (an empty param renders to ``None`` or "")."""
    normalized: dict[str, str | None] = {}
    for name in GRANTED_FIELDS:
        value = params.get(name)
        normalized[name] = None if value in (None, "", "None") else str(value)
    return normalized


def sign_grant(
    *,
    run_id: str,
    dag_id: str,
    team: str | None,
    user_name: str,
    stream_id: str,
    params: Mapping[str, Any],
) -> str:
    """The grant for one run of a redrive Dag (of ``team``), made by the page after it authorized the user."""
    return str(
        _serializer().dumps(
            {
                "run_id": run_id,
                "dag_id": dag_id,
                "team": team or None,
                "user": user_name,
                "stream": stream_id,
                "params": granted_params(params),
            }
        )
    )


def bind_grant(grant: str, task_instance_id: str) -> str:
    """
    ``grant`` (the page's own, for the run it just created) bound to the id of that run's redrive
    task instance: only that task instance accepts it.
    """
    signed = _serializer().loads(grant, max_age=GRANT_MAX_AGE_SECONDS)
    return str(_serializer().dumps({**signed, TASK_INSTANCE_FIELD: str(task_instance_id)}))


def check_grant(
    grant: Any,
    *,
    run_id: str,
    dag_id: str,
    team: str | None,
    triggering_user_name: str | None,
    params: Mapping[str, Any],
    task_instance_id: str,
) -> str:
    """
    The stream id a grant names, if it was made for this very run of this Dag (bound to this task
    instance of it), of this team, for this user and these addresses; raises
    :class:`RedriveNotGrantedError` otherwise (:class:`GrantNotBoundError`: not bound yet).
    """
    from itsdangerous import BadSignature, SignatureExpired

    if not isinstance(grant, str) or not grant or grant == "None":
        raise RedriveNotGrantedError(
            "this redrive run carries no grant: start the redrive from the Streams page, which checks "
            "that you may trigger the stream's Dags (a conf written by hand is not trusted)"
        )
    try:
        signed = _serializer().loads(grant, max_age=GRANT_MAX_AGE_SECONDS)
    except SignatureExpired as exc:
        raise RedriveNotGrantedError("the redrive grant has expired: start the redrive again") from exc
    except BadSignature as exc:
        raise RedriveNotGrantedError("the redrive grant was not signed by this deployment") from exc
    if signed.get("run_id") != run_id:
        raise RedriveNotGrantedError(f"the redrive grant was made for another run, not {run_id!r}")
    if signed.get("dag_id") != dag_id:
        raise RedriveNotGrantedError(f"the redrive grant was made for a run of another Dag, not {dag_id!r}")
    if signed.get("team") != (team or None):
        raise RedriveNotGrantedError(
            f"the redrive grant was made for a stream of another team than this Dag's ({team or 'no team'}): "
            "a team's redrives run in its own redrive Dag"
        )
    if not triggering_user_name or signed.get("user") != triggering_user_name:
        raise RedriveNotGrantedError(
            f"the redrive grant was made for another user than the one who triggered this run "
            f"({triggering_user_name!r})"
        )
    wanted = granted_params(params)
    changed = sorted(name for name in GRANTED_FIELDS if signed.get("params", {}).get(name) != wanted[name])
    if changed:
        raise RedriveNotGrantedError(
            f"this run's {', '.join(changed)} differ from what the grant of stream {signed.get('stream')!r} "
            "allows"
        )
    bound_to = signed.get(TASK_INSTANCE_FIELD)
    if bound_to is None:
        raise GrantNotBoundError(
            "the redrive grant was never bound to this run's task instance by the Streams page "
            "(a run created by hand with a copied conf): start the redrive from the page"
        )
    if bound_to != str(task_instance_id):
        raise RedriveNotGrantedError(
            f"the redrive grant was made for another instance of run {run_id!r} (a run deleted and "
            "created again under its run id, or a task cleared or retried): start the redrive from "
            "the Streams page"
        )
    return str(signed.get("stream"))
