"""
The stranded-event sweep next to another scheduler creating runs, on PostgreSQL.

The "other scheduler" is Airflow's own code: ``SchedulerJobRunner._create_dagruns_for_dags``
(``DagModel.dags_needing_dagruns`` locks the Dag's row ``FOR NO KEY UPDATE SKIP LOCKED``, then
``_create_dag_runs_asset_triggered`` locks the queue rows, creates the run, links its events and
deletes the rows), in a session of its own, whose commit the test decides. The Dag is on two
assets and written by core's parsing code, so the scheduler sees what a dag-processor leaves.
Both interleavings are played by hand, one statement after the other: deterministic, no race.

The stranded event is made by core itself: with the mitigation's refresh off, the second event
of an asset finds its queue row and leaves it as it is; the run created from the row takes the
first event only (apache/airflow#56050).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import pytest
from sqlalchemy import select, text

from airflow_shared_stream import scheduling

if TYPE_CHECKING:
    from sqlalchemy.orm import Session

pytestmark = [
    pytest.mark.integration,
    pytest.mark.parametrize("metadata_db_url", ["postgresql"], indirect=True),
]

SETTING = "AIRFLOW__SHARED_STREAM__REQUEUE_STRANDED_ASSET_EVENTS"
_dag_numbers = itertools.count(1)


class _HeldCommit:
    """Stands in for the scheduler's commit guard: the test commits the session when it says."""

    def commit(self) -> None:
        pass


@dataclass
class TwoAssetDag:
    dag_id: str
    assets: dict[str, tuple[str, str]]  # "x" / "y" -> (name, uri)

    def event(self, which: str) -> int:
        """Register an event of asset ``which`` as core does; commit it; return its id."""
        from airflow import settings
        from airflow.assets.manager import AssetManager
        from airflow.serialization.definitions.assets import SerializedAssetUniqueKey

        name, uri = self.assets[which]
        session = settings.Session()
        event = AssetManager.register_asset_change(
            asset=SerializedAssetUniqueKey(name=name, uri=uri), extra={}, session=session
        )
        assert event is not None
        event_id = int(event.id)
        session.commit()
        return event_id

    def consumed(self) -> dict[str, list[int]]:
        """run_id -> ids of the asset events it consumed, for every run of the Dag."""
        from airflow import settings

        session = settings.Session()
        try:
            rows = session.execute(
                text(
                    "SELECT r.run_id, e.event_id FROM dag_run r"
                    " LEFT JOIN dagrun_asset_event e ON e.dag_run_id = r.id"
                    " WHERE r.dag_id = :d ORDER BY r.id, e.event_id"
                ),
                {"d": self.dag_id},
            ).all()
        finally:
            session.rollback()
        runs: dict[str, list[int]] = {}
        for run_id, event_id in rows:
            runs.setdefault(run_id, [])
            if event_id is not None:
                runs[run_id].append(event_id)
        return runs

    def event_ids(self) -> set[int]:
        from airflow import settings
        from airflow.models.asset import AssetEvent, AssetModel

        session = settings.Session()
        try:
            names = [name for name, _ in self.assets.values()]
            return set(
                session.scalars(
                    select(AssetEvent.id)
                    .join(AssetModel, AssetModel.id == AssetEvent.asset_id)
                    .where(AssetModel.name.in_(names))
                )
            )
        finally:
            session.rollback()


@pytest.fixture
def dag(metadata_db: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[TwoAssetDag]:
    """An unpaused Dag scheduled on ``AssetAny(x, y)``, written by core's parsing code."""
    from airflow import settings
    from airflow.dag_processing.collection import update_dag_parsing_results_in_db
    from airflow.models.dagbundle import DagBundleModel
    from airflow.providers.standard.operators.empty import EmptyOperator
    from airflow.sdk import DAG, Asset, AssetAny
    from airflow.serialization.serialized_objects import LazyDeserializedDAG

    monkeypatch.setenv(SETTING, "True")  # the sweep; the refresh acts only on trigger events
    number = next(_dag_numbers)
    assets = {k: (f"two_schedulers_{number}_{k}", f"kafka://two-schedulers-{number}/{k}") for k in "xy"}
    dag_id = f"two_assets_{number}"
    with DAG(
        dag_id=dag_id,
        schedule=AssetAny(*(Asset(name, uri=uri) for name, uri in assets.values())),
        catchup=False,
        max_active_runs=16,
    ) as sdk_dag:
        EmptyOperator(task_id="noop")
    session = settings.Session()
    if session.get(DagBundleModel, "bundle") is None:
        session.add(DagBundleModel(name="bundle"))
        session.flush()
    update_dag_parsing_results_in_db(
        "bundle", None, [LazyDeserializedDAG.from_dag(sdk_dag)], {}, None, set(), session=session
    )
    session.execute(text("UPDATE dag SET is_paused = false WHERE dag_id = :d"), {"d": dag_id})
    session.commit()
    yield TwoAssetDag(dag_id=dag_id, assets=assets)
    session.close()


@pytest.fixture
def scheduler() -> Any:
    """Core's scheduler runner; only its run-creation step is used (no executor is started)."""
    from airflow.executors.local_executor import LocalExecutor
    from airflow.jobs.job import Job
    from airflow.jobs.scheduler_job_runner import SchedulerJobRunner

    return SchedulerJobRunner(job=Job(), executors=[LocalExecutor()])


_open_sessions: list[Session] = []


@pytest.fixture(autouse=True)
def _end_every_transaction(dag: TwoAssetDag) -> Iterator[None]:
    """Roll back what a failed test left open, before the tables are emptied (it holds locks)."""
    yield
    while _open_sessions:
        session = _open_sessions.pop()
        session.rollback()
        session.close()


def _own_session() -> Session:
    """A session of its own (not the thread-scoped one): another scheduler's transaction."""
    from airflow import settings

    assert settings.Session is not None
    session = settings.Session.session_factory()
    _open_sessions.append(session)
    return session


def _create_runs(scheduler: Any) -> Session:
    """Core's run creation, left uncommitted: the caller commits (or not) when it wants."""
    session = _own_session()
    scheduler._create_dagruns_for_dags(_HeldCommit(), session)
    session.flush()
    return session


def _create_runs_and_commit(scheduler: Any) -> None:
    session = _create_runs(scheduler)
    session.commit()
    session.close()


def _strand_an_event_of_y(dag: TwoAssetDag, scheduler: Any) -> int:
    """Core's own stranding: y's second event finds y's row; the run takes the first only."""
    first = dag.event("y")
    second = dag.event("y")
    _create_runs_and_commit(scheduler)
    assert list(dag.consumed().values()) == [[first]]
    return second


def _assert_every_event_consumed_once_and_no_empty_run(dag: TwoAssetDag) -> None:
    runs = dag.consumed()
    empty = [run_id for run_id, events in runs.items() if not events]
    assert not empty, f"runs with no asset event: {empty} (all runs: {runs})"
    consumed = [event for events in runs.values() for event in events]
    twice = sorted({event for event in consumed if consumed.count(event) > 1})
    assert not twice, f"asset events consumed by two runs: {twice} (all runs: {runs})"
    assert set(consumed) == dag.event_ids(), f"events in no run (all runs: {runs})"


def test_a_sweep_while_another_scheduler_creates_the_run_does_nothing(
    dag: TwoAssetDag, scheduler: Any
) -> None:
    """
    Scheduler A has created the run that consumes x's new event and y's stranded one, and not yet
    committed. Scheduler B's sweep still sees y's event as unconsumed and y without a queue row.
    Without the Dag's lock it queued y afresh, and once both committed the next run had no event.
    Nor may the sweep wait for A (it runs in B's scheduling loop, holding B's own locks): with
    ``lock_timeout`` set, a sweep that waited fails here instead of hanging the test.
    """
    _strand_an_event_of_y(dag, scheduler)
    dag.event("x")
    creating = _create_runs(scheduler)  # A: holds the Dag's row, the run not yet committed
    sweeper = _own_session()  # B
    sweeper.execute(text("SET lock_timeout = '10s'"))
    scheduling.requeue_stranded_asset_events(dag.dag_id, session=sweeper)
    sweeper.commit()
    creating.commit()
    _create_runs_and_commit(scheduler)
    _assert_every_event_consumed_once_and_no_empty_run(dag)


def test_a_run_created_while_a_sweep_is_uncommitted_waits_for_its_rows(
    dag: TwoAssetDag, scheduler: Any
) -> None:
    """
    Scheduler B sweeps (y re-queued, its transaction still open); then x gets an event, newer
    than the sweep's row, and scheduler A creates runs. Without the Dag's lock A's run consumed
    both events, B committed a row older than that run, and the run created from it took y's
    stranded event a second time (its window reached back past A's run).
    """
    stranded = _strand_an_event_of_y(dag, scheduler)
    sweeper = _own_session()  # B
    requeued = scheduling.requeue_stranded_asset_events(dag.dag_id, session=sweeper)
    assert [(s.events, s.newest_event is not None) for s in requeued] == [(1, True)]
    dag.event("x")
    _create_runs_and_commit(scheduler)  # A: skips the Dag, whose row B holds
    sweeper.commit()
    _create_runs_and_commit(scheduler)
    _assert_every_event_consumed_once_and_no_empty_run(dag)
    assert any(stranded in events for events in dag.consumed().values())


def test_a_stranded_event_stamped_ahead_of_the_schedulers_clock_is_in_the_next_run(
    dag: TwoAssetDag, scheduler: Any
) -> None:
    """A triggerer whose clock runs ahead: the queue row must not be older than the event."""
    from airflow import settings

    stranded = _strand_an_event_of_y(dag, scheduler)
    session = settings.Session()
    session.execute(
        text("UPDATE asset_event SET timestamp = timestamp + :ahead WHERE id = :id"),
        {"ahead": timedelta(minutes=5), "id": stranded},
    )
    session.commit()
    sweeper = _own_session()
    assert len(scheduling.requeue_stranded_asset_events(dag.dag_id, session=sweeper)) == 1
    sweeper.commit()
    _create_runs_and_commit(scheduler)
    _assert_every_event_consumed_once_and_no_empty_run(dag)


def _trigger_event(dag: TwoAssetDag, which: str) -> int:
    """A watcher's event: ``from_trigger``, in the thread-scoped session (where core registers it)."""
    from airflow import settings
    from airflow.assets.manager import AssetManager
    from airflow.serialization.definitions.assets import SerializedAssetUniqueKey

    name, uri = dag.assets[which]
    session = settings.Session()
    event = AssetManager.register_asset_change(
        asset=SerializedAssetUniqueKey(name=name, uri=uri), extra={"from_trigger": True}, session=session
    )
    assert event is not None
    event_id = int(event.id)
    session.commit()
    return event_id


def test_an_outlet_event_committed_after_a_refreshed_run_is_in_a_later_run(
    dag: TwoAssetDag, scheduler: Any
) -> None:
    """
    A task outlet's event e1 is flushed, its transaction still open (the execution API's
    request); a watcher's event of the same asset commits, and its refresh moves the queue row
    past e1's timestamp; the scheduler creates the run (e1 is invisible to it); then e1
    commits. Had the refresh moved the row, e1 would be below that run's ``run_after``: in no
    run's window ever, and under the sweep's floor too. Core alone leaves the row where it was,
    and e1 is consumed by a later run: the refresh must never do worse.
    """
    from airflow.assets.manager import AssetManager
    from airflow.serialization.definitions.assets import SerializedAssetUniqueKey

    dag.event("x")  # the queue row of x, committed
    outlet = _own_session()
    name, uri = dag.assets["x"]
    outlet_event = AssetManager.register_asset_change(
        asset=SerializedAssetUniqueKey(name=name, uri=uri), extra={}, session=outlet
    )
    assert outlet_event is not None
    outlet.flush()  # e1 is written and stamped, not committed
    _trigger_event(dag, "x")  # the watcher's event commits (and the refresh runs)
    _create_runs_and_commit(scheduler)  # the run is created while e1 is uncommitted
    outlet.commit()
    # The first run's start and end sweep (the listener's work, done here by hand) ...
    for _ in range(2):
        sweeper = _own_session()
        scheduling.requeue_stranded_asset_events(dag.dag_id, session=sweeper)
        sweeper.commit()
    _create_runs_and_commit(scheduler)
    # ... and, with or without the sweep, the next event of the asset brings what is left.
    dag.event("x")
    _create_runs_and_commit(scheduler)
    _assert_every_event_consumed_once_and_no_empty_run(dag)


def test_an_outlet_event_stamped_before_the_refresh_and_written_after_its_check_is_in_a_later_run(
    dag: TwoAssetDag, scheduler: Any
) -> None:
    """
    FAULT_MODEL 10 (many machines) and 13 (load), issue 46 item 10: an asset event's timestamp
    is taken in the writer's process (``AssetEvent.timestamp`` defaults to ``timezone.utcnow``,
    evaluated at flush) *before* its ``INSERT`` reaches PostgreSQL and takes ``RowExclusiveLock``.
    A task outlet's process (the api-server) descheduled between the two, on a loaded machine,
    leaves nothing in ``pg_locks`` for the refresh to see, although its event is stamped before
    the refresh's ``now``. A watcher's event commits in that gap and its refresh moves the queue
    row past e1; the outlet's ``INSERT`` then lands, the scheduler creates the run (e1 invisible,
    uncommitted), e1 commits: below that run's ``run_after``, in no later window, under the
    sweep's floor. Core alone (no refresh) leaves the row where it was, and e1 is consumed by a
    later run: the mitigation does worse than core here. The gap is played by holding the
    outlet's connection in ``before_cursor_execute`` (the parameters, timestamp included, are
    already bound), i.e. the process preempted for the length of one other transaction.
    """
    from airflow.assets.manager import AssetManager
    from airflow.serialization.definitions.assets import SerializedAssetUniqueKey
    from sqlalchemy import event as sa_event

    dag.event("x")  # the queue row of x, committed
    outlet = _own_session()
    outlet_connection = outlet.connection()
    played: list[int] = []

    def preempted(conn: Any, cursor: Any, statement: str, parameters: Any, context: Any, many: bool) -> None:
        if played or not statement.lstrip().upper().startswith("INSERT INTO ASSET_EVENT"):
            return
        # e1 is stamped (the bound parameters hold its timestamp) but not written: no lock yet.
        played.append(_trigger_event(dag, "x"))  # a watcher's event commits; its refresh runs

    sa_event.listen(outlet_connection, "before_cursor_execute", preempted)
    try:
        name, uri = dag.assets["x"]
        outlet_event = AssetManager.register_asset_change(
            asset=SerializedAssetUniqueKey(name=name, uri=uri), extra={}, session=outlet
        )
        assert outlet_event is not None
        outlet.flush()  # e1 is written, not committed
    finally:
        sa_event.remove(outlet_connection, "before_cursor_execute", preempted)
    assert played, "the outlet's INSERT was never seen"
    _create_runs_and_commit(scheduler)  # the run is created while e1 is uncommitted
    outlet.commit()
    for _ in range(2):  # the first run's start and end sweep
        sweeper = _own_session()
        scheduling.requeue_stranded_asset_events(dag.dag_id, session=sweeper)
        sweeper.commit()
    _create_runs_and_commit(scheduler)
    dag.event("x")  # and the next event of the asset brings what is left
    _create_runs_and_commit(scheduler)
    _assert_every_event_consumed_once_and_no_empty_run(dag)
