"""
Who may see and redrive which stream (airflow_shared_stream/console/access.py), decided by Airflow's
real simple auth manager in multi-team mode (only its lookup is replaced: no api-server here). The
same rules against a running api-server: tests/e2e/test_streams_page_teams.py.
"""

from __future__ import annotations

from typing import Any

import pytest
from airflow.api_fastapi.auth.managers.simple.simple_auth_manager import SimpleAuthManager
from airflow.api_fastapi.auth.managers.simple.user import SimpleAuthManagerUser

from airflow_shared_stream.console.access import RedriveDag, redrive_dag_of, redrive_refusal, visible_streams
from airflow_shared_stream.console.streams import Stream, group_streams
from airflow_shared_stream.redrive_dag import REDRIVE_DAG_ID, redrive_dag_id

SQS = "airflow_shared_stream.sqs.trigger.SqsSharedStreamTrigger"
TEAMS = {"orders_a": "team_a", "orders_b": "team_b", "shared_a": "team_a", "shared_b": "team_b"}
REDRIVE = {
    redrive_dag_id(team): RedriveDag(dag_id=redrive_dag_id(team), deployed=True, paused=False, team=team)
    for team in (None, "team_a", "team_b")
}
"""The redrive Dag of no team and one per team, each in a bundle of its team."""
REDRIVE_A = redrive_dag_id("team_a")
ALICE = SimpleAuthManagerUser(username="alice", role="user", teams=["team_a"])
ADMIN = SimpleAuthManagerUser(username="admin", role="admin", teams=[])
VIEWER_A = SimpleAuthManagerUser(username="vera", role="viewer", teams=["team_a"])


@pytest.fixture(autouse=True)
def simple_auth_manager(monkeypatch: pytest.MonkeyPatch) -> None:
    import airflow.api_fastapi.app

    manager = SimpleAuthManager()
    monkeypatch.setattr(airflow.api_fastapi.app, "get_auth_manager", lambda: manager)


def _streams() -> list[Stream]:
    """Team A's stream, team B's stream, and one queue both teams' Dags read (one watcher each)."""

    def row(trigger_id: int, queue: str, match: str | None) -> tuple[int, str, dict[str, Any], int]:
        url = f"https://sqs.us-east-1.amazonaws.com/000000000000/{queue}"
        return (trigger_id, SQS, {"queue_url": url, "dead_letter_queue_url": url + "-dlq", "match": match}, 1)

    streams = group_streams(
        [row(1, "a", None), row(2, "b", None), row(3, "shared", "x"), row(4, "shared", "y")]
    )
    dags = {1: ["orders_a"], 2: ["orders_b"], 3: ["shared_a"], 4: ["shared_b"]}
    for stream in streams:
        for watcher in stream.watchers:
            watcher.dags = dags[watcher.trigger_id]
            watcher.names = [f"watcher_{watcher.trigger_id}"]
        if len(stream.watchers) > 1:
            stream.warnings = [
                {"kind": "stranded", "dag_id": "shared_b", "message": "shared_b waits"},
                {"kind": "unassigned", "trigger_id": "4", "message": "watcher_4 unassigned"},
            ]
            stream.figures = {"lag": {"watcher_3": {"0": 1}, "watcher_4": {"0": 2}}}
    return streams


def _queues(streams: list[Stream]) -> set[str]:
    return {s.upstream["queue_url"].rsplit("/", 1)[1] for s in streams}


def test_a_user_sees_the_streams_of_the_dags_their_team_may_read() -> None:
    assert _queues(visible_streams(_streams(), ALICE, TEAMS)) == {"a", "shared"}
    assert _queues(visible_streams(_streams(), VIEWER_A, TEAMS)) == {"a", "shared"}
    assert _queues(visible_streams(_streams(), ADMIN, TEAMS)) == {"a", "b", "shared"}


def test_of_a_shared_stream_a_user_sees_only_the_watchers_of_their_dags() -> None:
    (shared,) = [s for s in visible_streams(_streams(), ALICE, TEAMS) if _queues([s]) == {"shared"}]
    text = repr(shared.to_json())
    assert [w.dags for w in shared.watchers] == [["shared_a"]]
    assert "shared_b" not in text
    assert "watcher_4" not in text
    assert "'y'" not in text
    assert shared.figures == {"lag": {"watcher_3": {"0": 1}}}


def test_a_redrive_needs_the_right_to_trigger_every_dag_of_the_stream() -> None:
    by_queue = {_queues([s]).pop(): s for s in visible_streams(_streams(), ALICE, TEAMS)}
    assert redrive_refusal(by_queue["a"], ALICE, TEAMS, REDRIVE) is None
    refused = redrive_refusal(by_queue["shared"], ALICE, TEAMS, REDRIVE)
    assert refused is not None
    assert refused.status == 403


def test_a_stream_is_redriven_through_the_redrive_dag_of_its_team() -> None:
    by_queue = {_queues([s]).pop(): s for s in visible_streams(_streams(), ADMIN, TEAMS)}
    assert redrive_dag_of(by_queue["a"], TEAMS) == "shared_stream_redrive_dead_letters__team_a"
    assert redrive_dag_of(by_queue["b"], TEAMS) == "shared_stream_redrive_dead_letters__team_b"
    assert redrive_dag_of(by_queue["a"], {}) == REDRIVE_DAG_ID  # no multi-team: the one Dag, as before
    no_team = {**TEAMS, "orders_a": None}
    assert redrive_dag_of(by_queue["a"], no_team) == REDRIVE_DAG_ID


def test_a_stream_of_dags_of_several_teams_is_refused_a_redrive() -> None:
    """No team's redrive Dag may hold it: the other team would not read its runs, or this one all."""
    (shared,) = [s for s in visible_streams(_streams(), ADMIN, TEAMS) if _queues([s]) == {"shared"}]
    assert redrive_dag_of(shared, TEAMS) is None
    refused = redrive_refusal(shared, ADMIN, TEAMS, REDRIVE)
    assert refused is not None
    assert refused.status == 409
    assert "several teams" in refused.reason


def test_a_team_without_its_redrive_dag_is_refused_with_what_to_deploy() -> None:
    """Never the Dag of no team nor another team's, though both are there and the user may trigger them."""
    (stream, *_) = visible_streams(_streams(), ADMIN, TEAMS)
    missing = {**REDRIVE, REDRIVE_A: RedriveDag(dag_id=REDRIVE_A, deployed=False, paused=False, team=None)}
    refused = redrive_refusal(stream, ADMIN, TEAMS, missing)
    assert refused is not None
    assert (refused.status, refused.reason) == (
        409,
        "The Dag shared_stream_redrive_dead_letters__team_a is not deployed: deploy "
        "redrive_dead_letters_dag(team='team_a') in a Dag bundle of team team_a.",
    )


@pytest.mark.parametrize("placed_in", [None, "team_b"])
def test_a_teams_redrive_dag_in_a_bundle_of_another_team_is_refused(placed_in: str | None) -> None:
    """Its runs would be read by that other team (or by every team), whatever its id says."""
    (stream, *_) = visible_streams(_streams(), ADMIN, TEAMS)
    misplaced = {
        **REDRIVE,
        REDRIVE_A: RedriveDag(dag_id=REDRIVE_A, deployed=True, paused=False, team=placed_in),
    }
    refused = redrive_refusal(stream, ADMIN, TEAMS, misplaced)
    assert refused is not None
    assert refused.status == 409
    assert "not of the stream's team team_a" in refused.reason


def test_the_right_asked_is_to_trigger_the_redrive_dag_of_the_streams_team(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import airflow.api_fastapi.app

    asked: list[tuple[str | None, str | None]] = []

    class RedriveRefused(SimpleAuthManager):  # type: ignore[misc]
        def is_authorized_dag(
            self, *, method: Any, user: Any, access_entity: Any = None, details: Any = None
        ) -> bool:
            if details and str(details.id).startswith(REDRIVE_DAG_ID):
                asked.append((details.id, details.team_name))
                return False
            return bool(
                super().is_authorized_dag(
                    method=method, user=user, access_entity=access_entity, details=details
                )
            )

    manager = RedriveRefused()
    monkeypatch.setattr(airflow.api_fastapi.app, "get_auth_manager", lambda: manager)
    (stream, *_) = visible_streams(_streams(), ALICE, TEAMS)
    refused = redrive_refusal(stream, ALICE, TEAMS, REDRIVE)
    assert refused is not None
    assert (refused.status, refused.reason) == (403, f"You may not trigger {REDRIVE_A}.")
    assert asked == [(REDRIVE_A, "team_a")]


def test_a_viewer_is_refused_the_redrive() -> None:
    (stream, *_) = visible_streams(_streams(), VIEWER_A, TEAMS)
    refused = redrive_refusal(stream, VIEWER_A, TEAMS, REDRIVE)
    assert refused is not None
    assert refused.status == 403


def test_a_paused_or_missing_redrive_dag_refuses_with_409() -> None:
    (stream, *_) = visible_streams(_streams(), ALICE, TEAMS)
    paused = {**REDRIVE, REDRIVE_A: RedriveDag(dag_id=REDRIVE_A, deployed=True, paused=True, team="team_a")}
    missing = {**REDRIVE, REDRIVE_A: RedriveDag(dag_id=REDRIVE_A, deployed=False, paused=False, team=None)}
    for redrive in (paused, missing):
        refused = redrive_refusal(stream, ALICE, TEAMS, redrive)
        assert refused is not None
        assert refused.status == 409
    assert "paused" in redrive_refusal(stream, ALICE, TEAMS, paused).reason  # type: ignore[union-attr]


BOB = SimpleAuthManagerUser(username="bob", role="user", teams=["team_b"])


def _seen_through_a_dag_of_no_team() -> tuple[Stream, dict[str, str | None]]:
    """team_a's queue, read by team_a's Dag and by a Dag of no team (which every team may read)."""
    url = "https://sqs.us-east-1.amazonaws.com/000000000000/a"
    kwargs = {"queue_url": url, "dead_letter_queue_url": url + "-dlq"}
    (stream,) = group_streams([(1, SQS, {**kwargs, "match": "x"}, 1), (2, SQS, {**kwargs, "match": "y"}, 1)])
    for watcher, dag in zip(stream.watchers, ["orders_a", "peek_no_team"], strict=True):
        watcher.dags = [dag]
        watcher.names = [f"watcher_{watcher.trigger_id}"]
    teams = {"orders_a": "team_a", "peek_no_team": None}
    (shown,) = visible_streams([stream], BOB, teams)
    assert shown.hidden_dags == ["orders_a"]
    return shown, teams


@pytest.mark.parametrize(
    "redrive_dags",
    [
        REDRIVE,
        {**REDRIVE, REDRIVE_A: RedriveDag(dag_id=REDRIVE_A, deployed=False, paused=False, team=None)},
        {**REDRIVE, REDRIVE_A: RedriveDag(dag_id=REDRIVE_A, deployed=True, paused=False, team="team_b")},
    ],
    ids=["deployed", "missing", "in-another-teams-bundle"],
)
def test_a_stream_seen_through_a_dag_of_no_team_names_no_team_of_its_hidden_dags(
    redrive_dags: dict[str, RedriveDag],
) -> None:
    """
    FAULT_MODEL 12 and 15 (authorized per Dag and team for reading). bob (team_b) sees team_a's
    stream through a Dag of no team; its other Dag is team_a's, which Airflow's API hides from him.
    The refusal he reads names neither team_a nor team_a's redrive Dag (it said "You may not
    trigger shared_stream_redrive_dead_letters__team_a", or told him to deploy
    redrive_dead_letters_dag(team='team_a')): he may not trigger a Dag of the stream anyway, and
    that is what he is told. Nor does the page name that Dag in the stream's JSON.
    """
    shown, teams = _seen_through_a_dag_of_no_team()
    refused = redrive_refusal(shown, BOB, teams, redrive_dags)
    assert refused is not None
    assert "team_a" not in refused.reason, refused.reason
    assert "orders_a" not in refused.reason, refused.reason
    assert refused.status == 403

    from airflow_shared_stream.console.access import shown_redrive_dag

    assert shown_redrive_dag(shown, BOB, teams) is None
    assert shown_redrive_dag(shown, ADMIN, teams) == REDRIVE_A  # who reads every Dag is told which


def test_a_redrive_dag_in_another_teams_bundle_is_refused_without_naming_that_team() -> None:
    """
    FAULT_MODEL 12. Someone of team_b deployed a Dag with team_a's redrive Dag id in team_b's
    bundle: alice (team_a) is refused, without learning the name of a team she is not in.
    """
    (stream, *_) = visible_streams(_streams(), ALICE, TEAMS)
    squatted = {
        **REDRIVE,
        REDRIVE_A: RedriveDag(dag_id=REDRIVE_A, deployed=True, paused=False, team="team_b"),
    }
    refused = redrive_refusal(stream, ALICE, TEAMS, squatted)
    assert refused is not None
    assert refused.status == 409
    assert "team_b" not in refused.reason, refused.reason
    assert "not of the stream's team team_a" in refused.reason


def test_a_watcher_feeding_a_dag_of_no_team_and_a_hidden_dag_does_not_name_the_hidden_one() -> None:
    """
    FAULT_MODEL 12 (authorized per Dag and team for reading). One watcher (one asset) feeds a Dag of
    no team, which bob (team_b) reads, and a Dag of team_a, which Airflow's API hides from him:
    the stream he is shown lists the hidden Dag's id in that watcher's Dags, and redrive_refusal
    does not count it hidden.
    """
    url = "https://sqs.us-east-1.amazonaws.com/000000000000/a"
    (stream,) = group_streams([(1, SQS, {"queue_url": url, "dead_letter_queue_url": url + "-dlq"}, 1)])
    stream.watchers[0].dags = ["orders_a", "peek_no_team"]
    stream.watchers[0].names = ["watcher_1"]
    (shown,) = visible_streams([stream], BOB, {"orders_a": "team_a", "peek_no_team": None})
    assert "orders_a" not in repr(shown.to_json()), shown.to_json()
    assert shown.hidden_dags == ["orders_a"]
