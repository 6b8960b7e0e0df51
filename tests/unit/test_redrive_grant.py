"""
The redrive grant (airflow_shared_stream/redrive_grant.py): what the Streams page signs for one
run and one user is all a run of the redrive Dag may move; anything else is refused before the
dead-letter source is read. The run-time refusal against a real api-server and worker is in
tests/e2e/test_streams_page_teams.py.
"""

from __future__ import annotations

import pytest

from airflow_shared_stream.redrive_grant import (
    GrantNotBoundError,
    RedriveNotGrantedError,
    bind_grant,
    check_grant,
    sign_grant,
)

PARAMS = {
    "broker": "sqs",
    "conn_id": "aws_team_a",
    "source": "http://127.0.0.1:5000/000000000000/team_a-orders",
    "dead_letter": "http://127.0.0.1:5000/000000000000/team_a-orders-dlq",
}


DAG_A = "shared_stream_redrive_dead_letters__team_a"
OF_TEAM_A = {"dag_id": DAG_A, "team": "team_a"}
TASK_INSTANCE = "0193a1b2-0000-7000-8000-00000000000a"
"""The id of the run's redrive task instance the page bound the grant to."""
"""The run's own Dag and that Dag's team (Airflow gives a task its run's team: its bundle's)."""


@pytest.fixture(autouse=True)
def secret_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AIRFLOW__API__SECRET_KEY", "a-secret-key-of-this-deployment")


def _grant(**overrides: object) -> str:
    arguments = {
        "run_id": "run-1",
        **OF_TEAM_A,
        "user_name": "alice",
        "stream_id": "sqs-orders-1",
        "params": PARAMS,
    }
    return bind_grant(sign_grant(**{**arguments, **overrides}), TASK_INSTANCE)  # type: ignore[arg-type]


def test_a_grant_lets_its_own_run_user_and_addresses_through() -> None:
    assert (
        check_grant(
            _grant(),
            run_id="run-1",
            **OF_TEAM_A,
            triggering_user_name="alice",
            params=PARAMS,
            task_instance_id=TASK_INSTANCE,
        )
        == "sqs-orders-1"
    )


def test_an_empty_source_matches_whether_it_renders_to_none_or_to_nothing() -> None:
    kafka = {"broker": "kafka", "conn_id": None, "source": None, "dead_letter": "orders-dlq"}
    rendered = {**kafka, "conn_id": "None", "source": ""}
    check_grant(
        _grant(params=kafka),
        run_id="run-1",
        **OF_TEAM_A,
        triggering_user_name="alice",
        params=rendered,
        task_instance_id=TASK_INSTANCE,
    )


@pytest.mark.parametrize("grant", [None, "", "None", "not-a-grant"])
def test_a_run_without_a_signed_grant_is_refused(grant: object) -> None:
    with pytest.raises(RedriveNotGrantedError):
        check_grant(
            grant,
            run_id="run-1",
            **OF_TEAM_A,
            triggering_user_name="alice",
            params=PARAMS,
            task_instance_id=TASK_INSTANCE,
        )


def test_a_grant_signed_with_another_key_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    grant = _grant()
    monkeypatch.setenv("AIRFLOW__API__SECRET_KEY", "another-deployments-key")
    with pytest.raises(RedriveNotGrantedError, match="not signed by this deployment"):
        check_grant(
            grant,
            run_id="run-1",
            **OF_TEAM_A,
            triggering_user_name="alice",
            params=PARAMS,
            task_instance_id=TASK_INSTANCE,
        )


def test_a_grant_copied_into_another_run_is_refused() -> None:
    with pytest.raises(RedriveNotGrantedError, match="made for another run"):
        check_grant(
            _grant(),
            run_id="run-2",
            **OF_TEAM_A,
            triggering_user_name="alice",
            params=PARAMS,
            task_instance_id=TASK_INSTANCE,
        )


@pytest.mark.parametrize("user", ["bob", None, ""])
def test_a_grant_used_by_another_user_is_refused(user: str | None) -> None:
    with pytest.raises(RedriveNotGrantedError, match="another user"):
        check_grant(
            _grant(),
            run_id="run-1",
            **OF_TEAM_A,
            triggering_user_name=user,
            params=PARAMS,
            task_instance_id=TASK_INSTANCE,
        )


def test_a_grant_bound_to_another_task_instance_is_refused() -> None:
    """A run deleted and created again under its run id (or a task cleared) has another task instance."""
    with pytest.raises(RedriveNotGrantedError, match="another instance of run"):
        check_grant(
            _grant(),
            run_id="run-1",
            **OF_TEAM_A,
            triggering_user_name="alice",
            params=PARAMS,
            task_instance_id="0193a1b2-0000-7000-8000-00000000000b",
        )


def test_a_grant_the_page_never_bound_is_refused() -> None:
    unbound = sign_grant(
        run_id="run-1", **OF_TEAM_A, user_name="alice", stream_id="sqs-orders-1", params=PARAMS
    )
    with pytest.raises(GrantNotBoundError, match="never bound"):
        check_grant(
            unbound,
            run_id="run-1",
            **OF_TEAM_A,
            triggering_user_name="alice",
            params=PARAMS,
            task_instance_id=TASK_INSTANCE,
        )


@pytest.mark.parametrize("field", sorted(PARAMS))
def test_a_run_whose_addresses_differ_from_the_grant_is_refused(field: str) -> None:
    changed = {**PARAMS, field: "kafka" if field == "broker" else "team_b-" + PARAMS[field]}
    with pytest.raises(RedriveNotGrantedError, match=field):
        check_grant(
            _grant(),
            run_id="run-1",
            **OF_TEAM_A,
            triggering_user_name="alice",
            params=changed,
            task_instance_id=TASK_INSTANCE,
        )


@pytest.mark.parametrize("team", ["team_b", None])
def test_a_grant_for_a_stream_of_another_team_is_refused_by_a_dag_of_that_team(team: str | None) -> None:
    """Team A's grant, replayed in a run of team B's (or the no-team) Dag under the same run id."""
    with pytest.raises(RedriveNotGrantedError, match="another team"):
        check_grant(
            _grant(),
            run_id="run-1",
            dag_id=DAG_A,
            team=team,
            triggering_user_name="alice",
            params=PARAMS,
            task_instance_id=TASK_INSTANCE,
        )


def test_a_grant_for_another_redrive_dag_is_refused() -> None:
    with pytest.raises(RedriveNotGrantedError, match="another Dag"):
        check_grant(
            _grant(),
            run_id="run-1",
            dag_id="shared_stream_redrive_dead_letters__team_b",
            team="team_a",
            triggering_user_name="alice",
            params=PARAMS,
            task_instance_id=TASK_INSTANCE,
        )


def test_a_grant_of_no_team_passes_a_dag_of_no_team() -> None:
    grant = _grant(dag_id="shared_stream_redrive_dead_letters", team=None)
    assert check_grant(
        grant,
        run_id="run-1",
        dag_id="shared_stream_redrive_dead_letters",
        team=None,
        triggering_user_name="alice",
        params=PARAMS,
        task_instance_id=TASK_INSTANCE,
    )


def test_without_a_secret_key_nothing_is_granted(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AIRFLOW__API__SECRET_KEY", "")
    with pytest.raises(RedriveNotGrantedError, match="secret_key"):
        _grant()


def test_the_redrive_task_refuses_a_run_without_a_grant_before_reading_anything() -> None:
    from types import SimpleNamespace

    from airflow_shared_stream.redrive import RedriveDeadLettersOperator

    task = RedriveDeadLettersOperator(
        task_id="redrive",
        broker="sqs",
        conn_id="aws_team_b",
        source="http://127.0.0.1:1/000000000000/team_b-orders",
        dead_letter="http://127.0.0.1:1/000000000000/team_b-orders-dlq",
        require_grant=True,
        grant="{{ params.grant }}",
    )
    task.grant = None  # what the Dag's empty param renders to
    run = SimpleNamespace(run_id="manual__1", dag_id="d", team_name=None, triggering_user_name="alice")
    with pytest.raises(RedriveNotGrantedError, match="carries no grant"):
        task.execute({"dag_run": run, "ti": SimpleNamespace(id=TASK_INSTANCE)})


def test_the_redrive_task_refuses_a_grant_of_another_team_than_its_runs() -> None:
    """The team is the one Airflow gives the run (its Dag's bundle's), never one from conf."""
    from types import SimpleNamespace

    from airflow_shared_stream.redrive import RedriveDeadLettersOperator

    task = RedriveDeadLettersOperator(
        task_id="redrive",
        broker="sqs",
        **{k: v for k, v in PARAMS.items() if k != "broker"},
        require_grant=True,
    )
    task.grant = _grant()  # team_a's grant for run-1 of team_a's Dag
    run = SimpleNamespace(run_id="run-1", dag_id=DAG_A, team_name="team_b", triggering_user_name="alice")
    with pytest.raises(RedriveNotGrantedError, match="another team"):
        task.execute({"dag_run": run, "ti": SimpleNamespace(id=TASK_INSTANCE)})


@pytest.mark.parametrize("value", ["soon", "-1", "nan"])
def test_a_bad_grant_bind_wait_is_refused_by_name(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    from airflow_shared_stream.common.redrive import RedriveConfigurationError
    from airflow_shared_stream.redrive import grant_bind_wait_seconds

    monkeypatch.setenv("AIRFLOW__SHARED_STREAM__REDRIVE_GRANT_BIND_WAIT_SECONDS", value)
    with pytest.raises(RedriveConfigurationError, match="redrive_grant_bind_wait_seconds"):
        grant_bind_wait_seconds()


def test_the_grant_bind_wait_is_the_configured_one(monkeypatch: pytest.MonkeyPatch) -> None:
    from airflow_shared_stream.redrive import GRANT_BIND_WAIT_SECONDS, grant_bind_wait_seconds

    assert grant_bind_wait_seconds() == GRANT_BIND_WAIT_SECONDS
    monkeypatch.setenv("AIRFLOW__SHARED_STREAM__REDRIVE_GRANT_BIND_WAIT_SECONDS", "7.5")
    assert grant_bind_wait_seconds() == 7.5
