"""
Who may see and act on which stream: the auth manager's answers for the stream's Dags, per team.

Asked as Airflow's REST API asks (``is_authorized_dag`` with the Dag's team, see
``airflow.api_fastapi.core_api.security.requires_access_dag``), so the page never shows or does
more than Airflow's own API would for the same person:

* a stream is shown to whoever may read at least one of the Dags its watchers schedule; of it
  they see the watchers of the Dags they may read (names, assets, ``match``), and the warnings
  and lag of those watchers only;
* a redrive of it needs the right to trigger every one of its Dags (the copies go back to a
  source all of them read), and the right to trigger the redrive Dag of the stream's team
  (:func:`~airflow_shared_stream.console.plugin.redrive_dag_id`), which is deployed in a bundle
  of that team and not paused. A run's conf and XCom are read by whoever may read its Dag, so a
  stream of a team is never redriven through a Dag of another team or of no team.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from airflow_shared_stream.console.streams import Stream
from airflow_shared_stream.redrive_dag import redrive_dag_id


@dataclass(frozen=True)
class RedriveDag:
    """The redrive Dag as the page needs it: whether it is there, paused, and its team."""

    dag_id: str
    deployed: bool
    paused: bool
    team: str | None


def dag_teams(session: Any, dag_ids: Iterable[str]) -> dict[str, str | None]:
    """Dag id -> its team (the team of its bundle; ``None``: no team)."""
    from airflow.models.dag import DagModel

    wanted = sorted(set(dag_ids))
    if not wanted:
        return {}
    found = DagModel.get_dag_id_to_team_name_mapping(wanted, session=session)
    return {dag_id: found.get(dag_id) for dag_id in wanted}


def read_redrive_dag(session: Any, dag_id: str) -> RedriveDag:
    """Whether the redrive Dag is deployed (parsed, not stale), paused, and its team."""
    from airflow.models.dag import DagModel
    from sqlalchemy import select

    row = session.execute(
        select(DagModel.is_paused).where(DagModel.dag_id == dag_id, DagModel.is_stale.is_(False))
    ).first()
    team = dag_teams(session, [dag_id]).get(dag_id)
    return RedriveDag(dag_id=dag_id, deployed=row is not None, paused=bool(row and row[0]), team=team)


def _authorized(user: Any, method: str, dag_id: str, team: str | None, run: bool = False) -> bool:
    from airflow.api_fastapi.app import get_auth_manager
    from airflow.api_fastapi.auth.managers.models.resource_details import DagAccessEntity, DagDetails

    return bool(
        get_auth_manager().is_authorized_dag(
            method=method,  # type: ignore[arg-type]
            access_entity=DagAccessEntity.RUN if run else None,
            details=DagDetails(id=dag_id, team_name=team),
            user=user,
        )
    )


def stream_dags(stream: Stream) -> set[str]:
    return {d for w in stream.watchers for d in w.dags}


def visible_streams(streams: list[Stream], user: Any, teams: Mapping[str, str | None]) -> list[Stream]:
    """The streams this user may see, each cut to the watchers of the Dags they may read."""
    readable = {d for d in teams if _authorized(user, "GET", d, teams[d])}
    shown = []
    for stream in streams:
        watchers = [w for w in stream.watchers if readable.intersection(w.dags)]
        if not watchers:
            continue
        if len(watchers) < len(stream.watchers) or any(set(w.dags) - readable for w in watchers):
            _cut_to(stream, watchers, readable)
        shown.append(stream)
    return shown


def _cut_to(stream: Stream, watchers: list[Any], readable: set[str]) -> None:
    """Drop what the hidden watchers would tell: their names, Dags, warnings and lag."""
    hidden_ids = {w.trigger_id for w in stream.watchers} - {w.trigger_id for w in watchers}
    hidden_names = {n for w in stream.watchers if w.trigger_id in hidden_ids for n in w.names}
    hidden_triggers = {str(i) for i in hidden_ids}
    stream.hidden_dags = sorted(stream_dags(stream) - readable)
    for watcher in watchers:  # a shown watcher may also feed a hidden Dag (one asset, several Dags)
        watcher.dags = [d for d in watcher.dags if d in readable]
    stream.watchers = watchers
    stream.warnings = [
        w
        for w in stream.warnings
        if w.get("dag_id", "") not in stream.hidden_dags and w.get("trigger_id") not in hidden_triggers
    ]
    if stream.figures and stream.figures.get("lag"):
        stream.figures["lag"] = {k: v for k, v in stream.figures["lag"].items() if k not in hidden_names}


@dataclass(frozen=True)
class Refusal:
    """Why a redrive is refused, and the status the POST answers with."""

    status: int
    reason: str


def stream_teams(stream: Stream, teams: Mapping[str, str | None]) -> set[str]:
    """The teams of the stream's Dags, hidden ones included (a Dag of no team adds none)."""
    return {team for d in stream_dags(stream) | set(stream.hidden_dags) if (team := teams.get(d))}


def redrive_dag_of(stream: Stream, teams: Mapping[str, str | None]) -> str | None:
    """The id of the redrive Dag for this stream: its team's (``None``: its Dags have several teams)."""
    owners = stream_teams(stream, teams)
    return None if len(owners) > 1 else redrive_dag_id(next(iter(owners), None))


def shown_redrive_dag(stream: Stream, user: Any, teams: Mapping[str, str | None]) -> str | None:
    """
    The redrive Dag the page names for this stream to this user: only to whoever reads every Dag
    of the stream (its id names the team of Dags the user may not see).
    """
    dags = stream_dags(stream) | set(stream.hidden_dags)
    if any(not _authorized(user, "GET", d, teams.get(d)) for d in dags):
        return None
    return redrive_dag_of(stream, teams)


def redrive_refusal(
    stream: Stream, user: Any, teams: Mapping[str, str | None], redrive_dags: Mapping[str, RedriveDag]
) -> Refusal | None:
    """
    Why this user may not redrive this stream now (``None``: they may), as the POST would answer.

    ``redrive_dags``: the redrive Dags by id, read for every id :func:`redrive_dag_of` names.
    """
    if not stream.redrive_params:
        return Refusal(409, "This stream has no dead-letter destination.")
    dags = stream_dags(stream) | set(stream.hidden_dags)
    refused = sorted(d for d in dags if not may_trigger(user, d, teams.get(d)))
    if set(refused) & set(stream.hidden_dags):  # before naming a redrive Dag: its id names their team
        return Refusal(403, f"You may not trigger every Dag this stream feeds ({len(refused)} refused).")
    dag_id = redrive_dag_of(stream, teams)
    if dag_id is None:  # several teams: say first what this user may not do anyway
        if refused:
            return Refusal(403, f"You may not trigger every Dag this stream feeds ({len(refused)} refused).")
        return Refusal(
            409,
            "This stream feeds Dags of several teams: no one team's redrive Dag may hold its runs "
            "(whoever may read a redrive Dag reads its runs' conf and XCom).",
        )
    team = next(iter(stream_teams(stream, teams)), None)
    redrive = redrive_dags[dag_id]
    if not redrive.deployed:
        deploy = (
            f": deploy redrive_dead_letters_dag(team={team!r}) in a Dag bundle of team {team}" if team else ""
        )
        return Refusal(409, f"The Dag {redrive.dag_id} is not deployed{deploy}.")
    if redrive.team != team:
        return Refusal(
            409,
            f"The Dag {redrive.dag_id} is in a Dag bundle of "
            f"{'another team' if redrive.team else 'no team'}, not of the "
            f"stream's {_team_text(team)}: move its file to a bundle of {_team_text(team)}.",
        )
    if not may_trigger(user, redrive.dag_id, redrive.team):
        return Refusal(403, f"You may not trigger {redrive.dag_id}.")
    if not dags:
        return Refusal(403, "No Dag reads this stream: nobody may redrive it from the page.")
    if refused:
        return Refusal(403, f"You may not trigger every Dag this stream feeds ({len(refused)} refused).")
    if redrive.paused:
        return Refusal(409, f"The Dag {redrive.dag_id} is paused: unpause it to redrive.")
    return None


def _team_text(team: str | None) -> str:
    return f"team {team}" if team else "no team"


def may_trigger(user: Any, dag_id: str, team: str | None) -> bool:
    """Whether this user may create runs of this Dag (with its team), as Airflow's API decides."""
    return _authorized(user, "POST", dag_id, team, run=True)
