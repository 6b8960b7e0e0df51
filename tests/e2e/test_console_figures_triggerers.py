"""
The Streams page's figures against real Airflow processes (issue 45 items 12 and 14): PostgreSQL,
dag-processor, scheduler and triggerers, SQS on moto. The page is read as the api-server reads it
(``read_streams`` on the deployment's metadata database, in a process of its own).

* A trigger that watches two assets (identical watchers of two assets are one trigger) publishes
  its stream's figures through Airflow's real asset state store.
* A triggerer that dies leaves its last figures in the store, keyed by its carrier trigger; once
  that trigger runs on another triggerer (which carries the stream by a lower trigger id), the
  dead triggerer's figures never count again.

How the watchers are placed, deterministically: the Dags are born paused. ``figures_moved_low``
and ``figures_shared`` are unpaused and triggerer B starts with capacity 2 (it takes both);
``figures_moved_high`` is unpaused and triggerer A starts with capacity 1 (it takes that one).
A is SIGKILLed once it has received part of the queue, B is replaced by B2 (capacity 10), which
takes the watchers B ran at once and A's when A's heartbeat is stale.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.support.airflow import AirflowDeployment
from tests.support.brokers import SqsServer
from tests.support.postgres import PostgresServer
from tests.support.processes import tail, wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]

DAGS = Path(__file__).parent / "figures_dags"
HEALTH_CHECK_THRESHOLD = 30
"""Seconds without a heartbeat before a dead triggerer's watchers move (room for B2 to start)."""
SHARED = {"figures_shared_watcher"}
LOW, HIGH = "figures_moved_low_watcher", "figures_moved_high_watcher"

READ_PAGE = """
import json
from airflow.utils.session import create_session
from airflow_shared_stream.console.streams import read_streams

with create_session() as session:
    print(json.dumps([{"upstream": s.upstream, "figures": s.figures} for s in read_streams(session)]))
"""


@dataclass
class Figures:
    airflow: AirflowDeployment
    sqs: SqsServer
    shared_queue_url: str
    moved_queue_url: str

    def page(self) -> dict[str, dict[str, Any] | None]:
        """Queue URL -> the figures the page shows for its stream (``None``: no figures)."""
        result = subprocess.run(
            [sys.executable, "-c", READ_PAGE],
            env=self.airflow._env(),
            capture_output=True,
            text=True,
            timeout=180,
            check=False,
        )
        if result.returncode != 0:
            raise RuntimeError(f"reading the page failed:\n{result.stderr[-3000:]}")
        streams = json.loads(result.stdout.strip().splitlines()[-1])
        return {s["upstream"]["queue_url"]: s["figures"] for s in streams}

    def placement(self) -> dict[str, int | None]:
        """Watcher name -> the triggerer job its trigger is assigned to."""
        with self.airflow.db() as conn:
            rows = conn.execute(
                "SELECT w.name, t.triggerer_id FROM asset_watcher w JOIN trigger t ON t.id = w.trigger_id"
            ).fetchall()
        return {r["name"]: r["triggerer_id"] for r in rows}

    def stored_figures(self, trigger_id: int) -> list[dict[str, Any]]:
        """The figures values written under a key ending in ``trigger_id``."""
        with self.airflow.db() as conn:
            rows = conn.execute("SELECT key, value FROM asset_state_store").fetchall()
        return [json.loads(r["value"]) for r in rows if r["key"].endswith(f".{trigger_id}")]


def _received(figures: dict[str, Any] | None) -> int | None:
    return None if figures is None else int(figures["totals"].get("received", 0))


def _n(payload: Any) -> Any:
    """The ``n`` of an SQS watcher's event payload (``{"body": {"n": ...}, ...}``)."""
    body = payload.get("body") if isinstance(payload, dict) else None
    return body.get("n") if isinstance(body, dict) else None


def _unpause(airflow: AirflowDeployment, dag_id: str, watchers: set[str]) -> None:
    airflow.cli("dags", "unpause", dag_id)

    def registered() -> bool:
        airflow.check_alive()
        return watchers <= airflow.watcher_trigger_ids().keys()

    wait_until(registered, 120, f"the watchers of {dag_id} to be registered", interval=0.5)


def _start_triggerer(airflow: AirflowDeployment, name: str, capacity: int, watchers: set[str]) -> None:
    airflow.start_component("triggerer", "--capacity", str(capacity), name=name)

    def running() -> bool:
        airflow.check_alive()
        ids = airflow.watcher_trigger_ids()
        return {ids[w] for w in watchers} <= airflow.assigned_trigger_ids()

    try:
        wait_until(running, 120, f"{name} to run {sorted(watchers)}", interval=0.5)
    except RuntimeError as exc:
        raise RuntimeError(f"{exc}\n{tail(airflow.log_path(name))}") from None


@pytest.fixture(scope="module")
def figures(e2e_dir: Path, sqs: SqsServer, postgres: PostgresServer) -> Iterator[Figures]:
    shared_queue_url = sqs.create_queue("figures-shared")
    moved_queue_url = sqs.create_queue("figures-moved")
    home = e2e_dir / "airflow-console-figures"
    dags = home / "dags"
    dags.mkdir(parents=True)
    (dags / "figures_watchers.py").symlink_to(DAGS / "figures_watchers.py")
    airflow = AirflowDeployment(
        home=home,
        dags_folder=dags,
        env={
            "AIRFLOW_CONN_AWS_DEFAULT": json.dumps(sqs.connection()),
            "FIGURES_SHARED_QUEUE_URL": shared_queue_url,
            "FIGURES_MOVED_QUEUE_URL": moved_queue_url,
            "AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION": "True",
            "AIRFLOW__DAG_PROCESSOR__MIN_FILE_PROCESS_INTERVAL": "3",
            "AIRFLOW__TRIGGERER__TRIGGERER_HEALTH_CHECK_THRESHOLD": str(HEALTH_CHECK_THRESHOLD),
            "AIRFLOW__SHARED_STREAM__FIGURES_PUBLISH_INTERVAL": "1",
        },
        database_url=postgres.create_database("airflow_console_figures"),
    )
    try:
        airflow.migrate()
        airflow.start_component("dag-processor")
        airflow.start_component("scheduler")
        airflow.wait_for_dags({"figures_shared", "figures_moved_low", "figures_moved_high"})
        _unpause(airflow, "figures_moved_low", {LOW})
        _unpause(airflow, "figures_shared", SHARED)
        _start_triggerer(airflow, "triggerer-b", 2, SHARED | {LOW})
        _unpause(airflow, "figures_moved_high", {HIGH})
        _start_triggerer(airflow, "triggerer-a", 1, {HIGH})
        yield Figures(airflow, sqs, shared_queue_url, moved_queue_url)
    finally:
        airflow.stop()


def test_a_trigger_of_two_assets_publishes_its_streams_figures(figures: Figures) -> None:
    with figures.airflow.db() as conn:
        rows = conn.execute(
            "SELECT a.name AS asset, w.trigger_id FROM asset_watcher w JOIN asset a ON a.id = w.asset_id"
            " WHERE w.name = 'figures_shared_watcher'"
        ).fetchall()
    assert len(rows) == 2, f"two assets: {rows}"
    assert len({r["trigger_id"] for r in rows}) == 1, f"one trigger: {rows}"
    figures.sqs.send(figures.shared_queue_url, [{"n": n} for n in range(7)])
    wait_until(
        lambda: _received(figures.page()[figures.shared_queue_url]) == 7,
        180,
        "the page to show 7 received for the stream of the trigger of two assets",
        interval=2,
    )


def test_a_dead_triggerers_figures_leave_the_page_when_its_carrier_runs_elsewhere(figures: Figures) -> None:
    airflow = figures.airflow
    ids = airflow.watcher_trigger_ids()
    assert ids[LOW] < ids[HIGH], f"the low watcher's trigger id is the lower: {ids}"
    placement = figures.placement()
    job_a, job_b = placement[HIGH], placement[LOW]
    assert job_a is not None, placement
    assert job_b not in (None, job_a), placement
    sent = 0

    def a_received() -> int:
        return max((_received(v) or 0 for v in figures.stored_figures(ids[HIGH])), default=0)

    page: dict[str, Any] = {}

    def settled(count: int) -> bool:
        """Every message fired its event and nothing is in flight: nothing comes back later."""
        page.update(figures.page())
        shown = page[figures.moved_queue_url]
        fired = {_n(e.payload) for e in airflow.asset_events() if e.asset_name.startswith("figures_moved")}
        return shown is not None and shown["in_flight"] == 0 and set(range(count)) <= fired

    # A leased queue split over two triggerers: each message goes to one; send until A has some.
    while a_received() == 0:
        assert sent < 200, "triggerer A never received a message of its queue"
        figures.sqs.send(figures.moved_queue_url, [{"n": n} for n in range(sent, sent + 20)])
        sent += 20
        try:
            wait_until(lambda count=sent: settled(count), 240, f"all {sent} messages settled", interval=2)
        except RuntimeError as exc:
            raise AssertionError(f"{exc}: {page.get(figures.moved_queue_url)}") from None
    airflow.kill_triggerer("triggerer-a")
    airflow.procs.pop("triggerer-a")  # killed on purpose: check_alive watches the others
    stopped = airflow.procs.pop("triggerer-b")  # stopped on purpose: not a component that died
    stopped.terminate()
    stopped.wait(60)
    airflow.start_component("triggerer", "--capacity", "10", name="triggerer-b2")

    def moved() -> bool:
        airflow.check_alive()
        now = figures.placement()
        return now[HIGH] == now[LOW] and now[LOW] not in (None, job_a, job_b)

    try:
        wait_until(moved, HEALTH_CHECK_THRESHOLD + 180, "every moved watcher to run on B2", interval=1)
    except RuntimeError as exc:
        raise RuntimeError(f"{exc}\n{tail(airflow.log_path('triggerer-b2'))}") from None
    # B2 counts from its own start: nothing is left in the queue, so nothing; A's last value
    # (a share of the messages, under A's carrier's key, which B2 runs now) must not count.
    assert a_received() > 0, "A's last figures are still in the store"

    def only_live_figures() -> bool:
        page.update(figures.page())
        shown = page[figures.moved_queue_url]
        return shown is not None and _received(shown) == 0 and shown["in_flight"] == 0

    try:
        wait_until(only_live_figures, 120, "the page to show only B2's figures", interval=2)
    except RuntimeError as exc:
        raise AssertionError(f"{exc}: {page.get(figures.moved_queue_url)}") from None
