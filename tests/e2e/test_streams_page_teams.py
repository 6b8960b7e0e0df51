"""
The Streams page and the redrive Dag against a multi-team deployment (issue 45, items 6 and 7).

A real api-server, scheduler, triggerer and dag-processor on PostgreSQL with ``[core] multi_team``
and Airflow's simple auth manager: teams ``team_a``, ``team_b`` and ``team_c`` each own a Dag
bundle with one SQS stream (its own queue, dead-letter queue and connection id); team_a's and
team_b's bundles hold their team's redrive Dag, team_c's none; the redrive Dag of no team sits in
a bundle of no team. Users: ``alice`` (role USER, team_a), ``bob`` (role USER, team_b), ``carol``
(role USER, team_c), ``admin``.

What Airflow's own REST API allows is the yardstick: alice may read and trigger team_a's Dags,
not team_b's, so the page shows her team_a's stream only, refuses her a redrive of team_b's, and
a run of the redrive Dag she triggers by hand with team_b's addresses moves nothing.
"""

from __future__ import annotations

import contextlib
import json
import socket
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from airflow_shared_stream.redrive_dag import redrive_dag_id
from tests.e2e.test_streams_page import REDRIVE_DAG_FILE, _plugins_folder
from tests.support.airflow import COMPONENTS, AirflowDeployment
from tests.support.brokers import SqsServer
from tests.support.postgres import PostgresServer
from tests.support.processes import wait_for_port, wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]

API = "/shared-stream/api/streams"
REDRIVE_DAG_ID = "shared_stream_redrive_dead_letters"
DAG_A = "shared_stream_redrive_dead_letters__team_a"
"""team_a's redrive Dag, by the documented convention (not computed: the test names what users deploy)."""
PASSWORDS = {"admin": "admin-pw-teams", "alice": "alice-pw-teams", "bob": "bob-pw-teams", "carol": "c-pw"}
TEAMS = ("team_a", "team_b", "team_c")
TEAMS_WITH_A_REDRIVE_DAG = ("team_a", "team_b")
TEAM_REDRIVE_DAG = """
from airflow_shared_stream.redrive_dag import redrive_dead_letters_dag

dag = redrive_dead_letters_dag(team={team!r})
"""
STREAM_DAG = """
from airflow.sdk import DAG, Asset, AssetWatcher
from airflow_shared_stream.sqs.trigger import SqsSharedStreamTrigger

trigger = SqsSharedStreamTrigger(
    queue_url={queue_url!r},
    aws_conn_id={conn_id!r},
    match="body.kind == 'order'",
    reject="body.poison == `true`",
    dead_letter_queue_url={dead_letter!r},
)
asset = Asset("{team}_orders", watchers=[AssetWatcher(name="{team}_orders_watcher", trigger=trigger)])
with DAG(dag_id="{team}_orders", schedule=asset, catchup=False):
    pass
"""


PEEK_DAG_ID = "peek_team_c_orders"
"""A Dag of no team on team_c's asset (its watcher, as team_c declares it): everyone reads it."""


@dataclass
class TeamStream:
    queue_url: str
    dead_letter_queue_url: str
    conn_id: str


@dataclass
class Teams:
    airflow: AirflowDeployment
    sqs: SqsServer
    streams: dict[str, TeamStream]
    tokens: dict[str, str]

    def request(self, method: str, path: str, user: str | None, **kwargs: Any) -> httpx.Response:
        headers = {
            **kwargs.pop("headers", {}),
            **({"Authorization": f"Bearer {self.tokens[user]}"} if user else {}),
        }
        return httpx.request(method, self.airflow.api_url + path, headers=headers, timeout=60, **kwargs)

    def streams_of(self, user: str) -> dict[str, dict[str, Any]]:
        """The streams the page lists to ``user``, by their queue URL."""
        answer = self.request("GET", API, user)
        assert answer.status_code == 200, answer.text
        return {s["upstream"]["queue_url"]: s for s in answer.json()["streams"]}

    def stream_id(self, team: str) -> str:
        return str(self.streams_of("admin")[self.streams[team].queue_url]["id"])

    def finished_run(self, run_id: str, dag_id: str = REDRIVE_DAG_ID) -> str:
        """The final state of a run of a redrive Dag."""
        states: dict[str, str | None] = {}

        def done() -> bool:
            self.airflow.check_alive()
            for run in self.airflow.dag_runs(dag_id):
                states[run.run_id] = run.state
            return states.get(run_id) in ("success", "failed")

        wait_until(done, 240, f"redrive run {run_id} of {dag_id} to finish", interval=1.0)
        return str(states[run_id])

    def dead_letter(self, team: str, bodies: list[dict[str, Any]]) -> None:
        """
        Dead letters of ``team``'s stream, stamped with their origin as our dead-lettering stamps
        them (``dead_letter_origin_queue``: the source queue's ARN): an unstamped message in a
        dead-letter queue is left by a redrive (docs/redrive.rst, the origin rule).
        """
        stream = self.streams[team]
        origin = {"DataType": "String", "StringValue": self.sqs.arn(stream.queue_url)}
        self.sqs.send(
            stream.dead_letter_queue_url, bodies, MessageAttributes={"dead_letter_origin_queue": origin}
        )

    def wait_for_the_executors_word(self, run_id: str, dag_id: str = REDRIVE_DAG_ID) -> None:
        """
        The scheduler has processed the executor's event for the run's task. It comes seconds
        after the run is marked done; a run re-created under the same id before it would take it
        as its own task's and be failed for it ("state changed externally", Airflow's doing).
        """
        scheduler_log = self.airflow.home / "process-logs" / "scheduler.log"
        event = (
            "Received executor event with state success for task instance "
            f"TaskInstanceKey(dag_id='{dag_id}', task_id='redrive', run_id='{run_id}'"
        )
        wait_until(
            lambda: event in scheduler_log.read_text(errors="replace"),
            120,
            "the executor's event for the first run's task",
            1.0,
        )

    def wait_for_log(self, run_id: str, text: str, dag_id: str = REDRIVE_DAG_ID) -> None:
        """The redrive task's log says ``text`` (the log is written on by the worker after the run ends)."""
        try:
            wait_until(lambda: text in self.airflow.task_log(dag_id, run_id, "redrive"), 60, text, 1.0)
        except Exception as exc:
            raise AssertionError(self.airflow.task_log(dag_id, run_id, "redrive")[-4000:]) from exc


def _bundles(home: Path, sqs: SqsServer) -> tuple[Path, list[dict[str, Any]], dict[str, TeamStream]]:
    shared = home / "dags"
    shared.mkdir(parents=True)
    (shared / REDRIVE_DAG_FILE.name).symlink_to(REDRIVE_DAG_FILE)
    config: list[dict[str, Any]] = [
        {
            "name": "shared",
            "classpath": "airflow.dag_processing.bundles.local.LocalDagBundle",
            "kwargs": {"path": str(shared)},
        }
    ]
    streams = {}
    for team in TEAMS:
        dead_letter = sqs.create_queue(f"{team}-orders-dlq")
        queue = sqs.create_queue(f"{team}-orders", dead_letter_queue_url=dead_letter)
        streams[team] = TeamStream(queue, dead_letter, f"aws_{team}")
        folder = home / f"{team}-dags"
        folder.mkdir()
        (folder / f"{team}_orders.py").write_text(
            STREAM_DAG.format(queue_url=queue, conn_id=f"aws_{team}", dead_letter=dead_letter, team=team)
        )
        if team == "team_c":  # the same asset and watcher, so the two files agree on them
            dag = STREAM_DAG.format(
                queue_url=queue, conn_id=f"aws_{team}", dead_letter=dead_letter, team=team
            )
            (shared / f"{PEEK_DAG_ID}.py").write_text(
                dag.replace(f'dag_id="{team}_orders"', f'dag_id="{PEEK_DAG_ID}"')
            )
        if team in TEAMS_WITH_A_REDRIVE_DAG:
            (folder / "redrive.py").write_text(TEAM_REDRIVE_DAG.format(team=team))
        config.append(
            {
                "name": f"{team}_bundle",
                "classpath": "airflow.dag_processing.bundles.local.LocalDagBundle",
                "kwargs": {"path": str(folder)},
                "team_name": team,
            }
        )
    return shared, config, streams


@pytest.fixture(scope="module")
def teams(e2e_dir: Path, sqs: SqsServer, postgres: PostgresServer) -> Iterator[Teams]:
    home = e2e_dir / "airflow-teams"
    shared, bundles, streams = _bundles(home, sqs)
    passwords = home / "passwords.json"
    passwords.write_text(json.dumps(PASSWORDS))
    connection = json.dumps(sqs.connection())
    env = {
        **_plugins_folder(home),
        **{f"AIRFLOW_CONN_{s.conn_id.upper()}": connection for s in streams.values()},
        "AIRFLOW__CORE__MULTI_TEAM": "True",
        "AIRFLOW__DAG_PROCESSOR__DAG_BUNDLE_CONFIG_LIST": json.dumps(bundles),
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS": "False",
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": (
            "admin:admin,alice:user:team_a,bob:user:team_b,carol:user:team_c"
        ),
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE": str(passwords),
        # No absolute base_url: the page must still never post where a Host header points.
        "AIRFLOW__API__BASE_URL": "",
        # The page binds a grant as it creates the run: a task waits this long for it, not the
        # default two minutes, before an unbound grant is refused.
        "AIRFLOW__SHARED_STREAM__REDRIVE_GRANT_BIND_WAIT_SECONDS": "30",
    }
    airflow = AirflowDeployment(
        home=home, dags_folder=shared, env=env, database_url=postgres.create_database("airflow_teams")
    )
    try:
        airflow.migrate()
        for team in TEAMS:  # the auth manager and the bundles need their teams in the database
            airflow.cli("teams", "create", team)
        for component in COMPONENTS:
            airflow.start_component(component)
        wait_for_port(airflow.api_port, 180, airflow.procs["api-server"], "airflow api-server")
        airflow.warm_up_execution_api()
        airflow.wait_for_dags(
            {f"{team}_orders" for team in TEAMS}
            | {redrive_dag_id(team) for team in TEAMS_WITH_A_REDRIVE_DAG}
            | {REDRIVE_DAG_ID, PEEK_DAG_ID}
        )
        tokens = {}
        for user, password in PASSWORDS.items():
            answer = httpx.post(
                f"{airflow.api_url}/auth/token", json={"username": user, "password": password}, timeout=30
            )
            assert answer.status_code == 201, answer.text
            tokens[user] = answer.json()["access_token"]
        deployment = Teams(airflow, sqs, streams, tokens)
        wait_until(
            lambda: len(deployment.streams_of("admin")) == 3, 120, "every team's stream on the page", 1.0
        )
        yield deployment
    finally:
        airflow.stop()


def test_a_user_sees_only_the_streams_of_dags_their_team_may_read(teams: Teams) -> None:
    queue_a, queue_b = teams.streams["team_a"].queue_url, teams.streams["team_b"].queue_url
    assert teams.request("GET", "/api/v2/dags/team_b_orders", "alice").status_code == 403
    queue_c = teams.streams["team_c"].queue_url  # seen by all through a Dag of no team
    assert set(teams.streams_of("alice")) == {queue_a, queue_c}
    assert set(teams.streams_of("bob")) == {queue_b, queue_c}
    assert set(teams.streams_of("admin")) == {s.queue_url for s in teams.streams.values()}
    text = teams.request("GET", API, "alice").text
    for leaked in (queue_b, teams.streams["team_b"].dead_letter_queue_url, "aws_team_b", "team_b_orders"):
        assert leaked not in text


def test_a_user_cannot_redrive_another_teams_stream_from_the_page(teams: Teams) -> None:
    runs_before = len(teams.airflow.dag_runs(REDRIVE_DAG_ID))
    refused = teams.request(
        "POST", f"{API}/{teams.stream_id('team_b')}/redrive", "alice", json={"dry_run": True}
    )
    assert refused.status_code == 404, refused.text
    assert len(teams.airflow.dag_runs(REDRIVE_DAG_ID)) == runs_before


def test_a_redrive_triggered_by_hand_with_another_teams_addresses_moves_nothing(teams: Teams) -> None:
    team_b = teams.streams["team_b"]
    teams.dead_letter("team_b", [{"event_id": "b-dead-1", "kind": "order"}])
    wait_until(lambda: teams.sqs.depth(team_b.dead_letter_queue_url).visible == 1, 30, "team_b's dead letter")
    conf = {
        "broker": "sqs",
        "conn_id": team_b.conn_id,
        "source": team_b.queue_url,
        "dead_letter": team_b.dead_letter_queue_url,
        "dry_run": False,
        "max_messages": 10,
    }
    answer = teams.request(
        "POST", f"/api/v2/dags/{REDRIVE_DAG_ID}/dagRuns", "alice", json={"logical_date": None, "conf": conf}
    )
    assert answer.status_code == 200, answer.text  # Airflow lets her trigger the redrive Dag itself
    run_id = answer.json()["dag_run_id"]
    assert teams.finished_run(run_id) == "failed"
    teams.wait_for_log(run_id, "carries no grant")
    assert teams.sqs.depth(team_b.dead_letter_queue_url).visible == 1
    assert teams.sqs.depth(team_b.queue_url).visible == 0


def test_a_granted_redrive_runs_and_its_conf_cannot_be_replayed_for_another_run(teams: Teams) -> None:
    team_a = teams.streams["team_a"]
    teams.dead_letter("team_a", [{"event_id": "a-dead-1", "kind": "other"}])
    wait_until(lambda: teams.sqs.depth(team_a.dead_letter_queue_url).visible == 1, 30, "team_a's dead letter")
    # Her request names an api-server that is not this one: the page must not follow it.
    with _listener() as (port, received):
        started = teams.request(
            "POST",
            f"{API}/{teams.stream_id('team_a')}/redrive",
            "alice",
            json={"dry_run": False, "max_messages": 10},
            headers={"Host": f"127.0.0.1:{port}"},
        )
    assert started.status_code == 201, started.text
    assert not received, "the page sent the user's request to the address the Host header named"
    assert started.headers["cache-control"] == "no-store"
    assert started.json()["dag_id"] == DAG_A
    run_id = started.json()["dag_run_id"]
    assert teams.finished_run(run_id, DAG_A) == "success", teams.airflow.task_log(DAG_A, run_id, "redrive")
    assert teams.sqs.depth(team_a.dead_letter_queue_url).visible == 0

    granted = teams.request("GET", f"/api/v2/dags/{DAG_A}/dagRuns/{run_id}", "alice").json()["conf"]
    replay = teams.request(
        "POST",
        f"/api/v2/dags/{DAG_A}/dagRuns",
        "alice",
        json={"logical_date": None, "conf": granted},
    )
    assert replay.status_code == 200, replay.text
    replay_id = replay.json()["dag_run_id"]
    assert teams.finished_run(replay_id, DAG_A) == "failed"
    teams.wait_for_log(replay_id, "made for another run", DAG_A)


def test_a_paused_redrive_dag_disables_the_redrive(teams: Teams) -> None:
    stream_id = teams.stream_id("team_a")
    assert teams.streams_of("alice")[teams.streams["team_a"].queue_url]["redrive_refused"] is None
    path = f"/api/v2/dags/{DAG_A}?update_mask=is_paused"
    assert teams.request("PATCH", path, "admin", json={"is_paused": True}).status_code == 200
    try:
        shown = teams.streams_of("alice")[teams.streams["team_a"].queue_url]
        assert "paused" in (shown["redrive_refused"] or "")
        refused = teams.request("POST", f"{API}/{stream_id}/redrive", "alice", json={"dry_run": True})
        assert refused.status_code == 409, refused.text
    finally:
        assert teams.request("PATCH", path, "admin", json={"is_paused": False}).status_code == 200


def test_every_json_answer_says_no_store(teams: Teams) -> None:
    answers = [
        teams.request("GET", API, "alice"),
        teams.request("GET", API, None),
        teams.request("POST", f"{API}/no-such-stream/redrive", "alice", json={"dry_run": True}),
        teams.request("POST", f"{API}/no-such-stream/redrive", "alice", json={"max_messages": 0}),
    ]
    assert [a.status_code for a in answers] == [200, 401, 404, 422]
    for answer in answers:
        assert answer.headers.get("cache-control") == "no-store", (answer.status_code, dict(answer.headers))


class _Recorder(threading.Thread):
    def __init__(self, server: socket.socket, received: list[bytes]) -> None:
        super().__init__(daemon=True)
        self.server, self.received = server, received

    def run(self) -> None:
        while True:
            try:
                conn, _ = self.server.accept()
            except OSError:
                return
            with conn:
                conn.settimeout(5)
                with contextlib.suppress(OSError):
                    self.received.append(conn.recv(65536))


class _listener:
    """A TCP listener on loopback that keeps whatever is sent to it (and answers nothing)."""

    def __enter__(self) -> tuple[int, list[bytes]]:
        self.server = socket.create_server(("127.0.0.1", 0))
        self.received: list[bytes] = []
        _Recorder(self.server, self.received).start()
        return self.server.getsockname()[1], self.received

    def __exit__(self, *exc: object) -> None:
        self.server.close()


def test_a_redrive_of_one_team_is_not_readable_by_another_team(teams: Teams) -> None:
    """
    FAULT_MODEL 12 and 15 (authorized per Dag and team for reading). The page hides team_a's
    stream from bob (team_b): its queue, dead-letter queue, connection id and dead letters. The
    runs the page creates for it are runs of team_a's own redrive Dag (in team_a's bundle), so
    bob reads neither their conf (team_a's queue URLs and connection id) nor their XCom (a dry
    run's samples: team_a's messages, whole) through Airflow's own REST API; nor are they runs of
    the Dag of no team, which every team reads.
    """
    team_a = teams.streams["team_a"]
    teams.dead_letter("team_a", [{"event_id": "a-private-order-77", "kind": "order"}])
    wait_until(lambda: teams.sqs.depth(team_a.dead_letter_queue_url).visible >= 1, 30, "team_a's dead letter")
    started = teams.request(
        "POST",
        f"{API}/{teams.stream_id('team_a')}/redrive",
        "alice",
        json={"dry_run": True, "max_messages": 10},
    )
    assert started.status_code == 201, started.text
    run_id = started.json()["dag_run_id"]
    assert teams.finished_run(run_id, DAG_A) == "success", teams.airflow.task_log(DAG_A, run_id, "redrive")
    xcom = f"dagRuns/{run_id}/taskInstances/redrive/xcomEntries/return_value"
    mine = teams.request("GET", f"/api/v2/dags/{DAG_A}/{xcom}", "alice")
    assert "a-private-order-77" in mine.text, mine.text  # the samples are there, for alice

    seen_by_bob = [
        teams.request("GET", f"/api/v2/dags/{dag_id}/{path}", "bob")
        for dag_id in (DAG_A, REDRIVE_DAG_ID, redrive_dag_id("team_b"))
        for path in ("dagRuns", f"dagRuns/{run_id}", xcom)
    ]
    for answer in seen_by_bob:
        for leaked in (team_a.queue_url, team_a.dead_letter_queue_url, team_a.conn_id, "a-private-order-77"):
            assert leaked not in answer.text, (answer.request.url, answer.status_code, leaked)


def test_a_team_without_its_redrive_dag_is_refused_never_sent_to_another(teams: Teams) -> None:
    """team_c has a stream and no redrive Dag: the Dag of no team is there, but would show its runs to all."""
    every_redrive_dag = [REDRIVE_DAG_ID, *(redrive_dag_id(t) for t in TEAMS_WITH_A_REDRIVE_DAG)]
    runs_before = {d: len(teams.airflow.dag_runs(d)) for d in every_redrive_dag}
    deploy = "redrive_dead_letters_dag(team='team_c')"
    shown = teams.streams_of("carol")[teams.streams["team_c"].queue_url]
    assert shown["redrive_dag_id"] == "shared_stream_redrive_dead_letters__team_c"
    assert deploy in (shown["redrive_refused"] or ""), shown["redrive_refused"]
    for user in ("carol", "admin"):
        refused = teams.request(
            "POST", f"{API}/{teams.stream_id('team_c')}/redrive", user, json={"dry_run": True}
        )
        assert refused.status_code == 409, refused.text
        assert deploy in refused.json()["detail"]
    assert {d: len(teams.airflow.dag_runs(d)) for d in every_redrive_dag} == runs_before


def test_a_grant_for_one_teams_stream_is_refused_by_another_teams_redrive_dag(teams: Teams) -> None:
    """
    The admin may trigger every Dag: a grant the page made for team_a's stream, replayed under
    its own run id in team_b's redrive Dag or in the Dag of no team, is refused by the task.
    """
    started = teams.request(
        "POST", f"{API}/{teams.stream_id('team_a')}/redrive", "admin", json={"dry_run": True}
    )
    assert started.status_code == 201, started.text
    run_id = started.json()["dag_run_id"]
    assert teams.finished_run(run_id, DAG_A) == "success", teams.airflow.task_log(DAG_A, run_id, "redrive")
    granted = teams.request("GET", f"/api/v2/dags/{DAG_A}/dagRuns/{run_id}", "admin").json()["conf"]
    for other in (redrive_dag_id("team_b"), REDRIVE_DAG_ID):
        replay = teams.request(
            "POST",
            f"/api/v2/dags/{other}/dagRuns",
            "admin",
            json={"dag_run_id": run_id, "logical_date": None, "conf": granted},
        )
        assert replay.status_code == 200, replay.text
        assert teams.finished_run(run_id, other) == "failed", teams.airflow.task_log(other, run_id, "redrive")
        teams.wait_for_log(run_id, "made for a run of another Dag", other)


def test_a_stream_seen_through_a_dag_of_no_team_names_no_team_of_its_hidden_dags(teams: Teams) -> None:
    """
    FAULT_MODEL 12 and 15 (authorized per Dag and team for reading). bob (team_b) sees team_c's
    stream through a Dag of no team scheduled on team_c's asset; team_c's Dag is hidden from him
    by Airflow's API. Neither the stream's JSON nor its redrive refusal (page or POST) names
    team_c, its Dag, or its redrive Dag; carol, who reads every Dag of it, is told which.
    """
    queue_c = teams.streams["team_c"].queue_url
    shown = teams.streams_of("bob")[queue_c]
    assert teams.request("GET", "/api/v2/dags/team_c_orders", "bob").status_code == 403
    assert [d for w in shown["watchers"] for d in w["dags"]] == [PEEK_DAG_ID]  # its asset feeds both
    assert shown["redrive_dag_id"] is None
    refused = teams.request("POST", f"{API}/{shown['id']}/redrive", "bob", json={"dry_run": True})
    assert refused.status_code == 403, refused.text
    for text in (json.dumps(shown), refused.text):
        for leaked in (redrive_dag_id("team_c"), "team team_c", "team='team_c'"):
            assert leaked not in text, (leaked, text)
    assert teams.streams_of("carol")[queue_c]["redrive_dag_id"] == redrive_dag_id("team_c")


def test_a_grant_is_refused_in_a_run_recreated_under_its_run_id(teams: Teams) -> None:
    """
    FAULT_MODEL 15 (authorized for acting) and 11. alice redrives team_a's stream from the page
    (a dry run). She then deletes that run and triggers team_a's redrive Dag by hand through
    Airflow's REST API with the same run id and the conf she read from it (grant included): the
    second run is not the one the page decided on, so whatever her rights are by then (her team,
    the stream's Dags moved to another team) it must move and sample nothing. Today it is the
    same run id, Dag, team, user and addresses: only the task instance differs, which the page
    bound the grant to once Airflow created the run.
    """
    teams.dead_letter("team_a", [{"event_id": "a-replayed-9", "kind": "order"}])
    started = teams.request(
        "POST", f"{API}/{teams.stream_id('team_a')}/redrive", "alice", json={"dry_run": True}
    )
    assert started.status_code == 201, started.text
    run_id = started.json()["dag_run_id"]
    assert teams.finished_run(run_id, DAG_A) == "success", teams.airflow.task_log(DAG_A, run_id, "redrive")
    conf = teams.request("GET", f"/api/v2/dags/{DAG_A}/dagRuns/{run_id}", "alice").json()["conf"]
    teams.wait_for_the_executors_word(run_id, DAG_A)
    deleted = teams.request("DELETE", f"/api/v2/dags/{DAG_A}/dagRuns/{run_id}", "alice")
    assert deleted.status_code == 204, deleted.text
    replay = teams.request(
        "POST",
        f"/api/v2/dags/{DAG_A}/dagRuns",
        "alice",
        json={"dag_run_id": run_id, "logical_date": None, "conf": conf},
    )
    assert replay.status_code == 200, replay.text
    assert teams.finished_run(run_id, DAG_A) == "failed", teams.airflow.task_log(DAG_A, run_id, "redrive")
    teams.wait_for_log(run_id, "made for another instance of run", DAG_A)


def _unbound_grant_from_the_audit_log(teams: Teams, user: str, run_id: str) -> dict[str, Any] | None:
    """The conf the page posted to create ``run_id`` (grant not yet bound), from Airflow's audit log."""
    answer = teams.request(
        "GET", "/api/v2/eventLogs", user, params={"dag_id": DAG_A, "limit": 100, "order_by": "-when"}
    )
    assert answer.status_code == 200, answer.text
    for entry in answer.json()["event_logs"]:
        extra = entry.get("extra") or ""
        if run_id not in extra or "grant" not in extra:
            continue
        with contextlib.suppress(ValueError, TypeError, AttributeError):
            conf = json.loads(extra).get("conf")
            if isinstance(conf, dict) and "grant" in conf:
                return conf
    return None


def test_the_pages_unbound_grant_read_from_the_audit_log_is_refused_in_a_recreated_run(teams: Teams) -> None:
    """
    FAULT_MODEL 15 and 12 (the unbound grant window). Airflow's audit log keeps the body of the
    page's trigger request: the conf with the grant *before* the page bound it. alice reads it
    there, deletes her run and triggers team_a's redrive Dag by hand under the granted run id with
    that conf. The task finds an unbound grant, asks its run again through the real Execution API
    for ``[shared_stream] redrive_grant_bind_wait_seconds`` (30 s here; the page binds nothing in a
    run it did not create) and is refused having read nothing.
    """
    teams.dead_letter("team_a", [{"event_id": "a-unbound-7", "kind": "order"}])
    started = teams.request(
        "POST", f"{API}/{teams.stream_id('team_a')}/redrive", "alice", json={"dry_run": True}
    )
    assert started.status_code == 201, started.text
    run_id = started.json()["dag_run_id"]
    if teams.finished_run(run_id, DAG_A) != "success":
        scheduler = (teams.airflow.home / "process-logs" / "scheduler.log").read_text(errors="replace")
        raise AssertionError(
            "\n".join(line for line in scheduler.splitlines() if run_id in line)[-6000:]
            + "\n--- task log ---\n"
            + teams.airflow.task_log(DAG_A, run_id, "redrive")[-6000:]
        )
    bound = teams.request("GET", f"/api/v2/dags/{DAG_A}/dagRuns/{run_id}", "alice").json()["conf"]
    unbound = _unbound_grant_from_the_audit_log(teams, "alice", run_id) or _unbound_grant_from_the_audit_log(
        teams, "admin", run_id
    )
    assert unbound is not None, "the audit log kept no conf of the page's trigger request"
    assert unbound["grant"] != bound["grant"]  # the page bound it after Airflow created the run

    teams.wait_for_the_executors_word(run_id, DAG_A)
    deleted = teams.request("DELETE", f"/api/v2/dags/{DAG_A}/dagRuns/{run_id}", "alice")
    assert deleted.status_code == 204, deleted.text
    replay = teams.request(
        "POST",
        f"/api/v2/dags/{DAG_A}/dagRuns",
        "alice",
        json={"dag_run_id": run_id, "logical_date": None, "conf": unbound},
    )
    assert replay.status_code == 200, replay.text
    assert teams.finished_run(run_id, DAG_A) == "failed", teams.airflow.task_log(DAG_A, run_id, "redrive")
    teams.wait_for_log(run_id, "never bound", DAG_A)
    assert "a-unbound-7" not in teams.airflow.task_log(DAG_A, run_id, "redrive")
