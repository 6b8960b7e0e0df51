"""
Re-queue asset events that Airflow 3.3's asset-triggered scheduling leaves stranded.

The cause (Airflow 3.3.2, ``assets/manager.py`` and
``SchedulerJobRunner._create_dag_runs_asset_triggered``): an asset event queues each Dag
scheduled on its asset with one ``AssetDagRunQueue`` (ADRQ) row per (asset, Dag) whose
``created_at`` is set only when the row is inserted (``ON CONFLICT DO NOTHING`` on PostgreSQL,
``merge`` on SQLite). The scheduler creates the run with
``triggered_date = max(created_at)``, gives it the events with ``timestamp <= triggered_date``
and deletes the rows it read. Events of an already-queued asset that arrive after its row was
created are in no run and leave no row behind: they wait for the *next* event of the stream,
which at the end of a burst may come the next morning (apache/airflow#56050; fixed on main by
#70972, where each ADRQ row references its asset event; not in any 3.x release).

Why a listener, not an asset manager: ``[core] asset_manager_class`` does not reach the events
this provider creates. ``Trigger.submit_event`` calls the base
``AssetManager.register_asset_change`` directly, so a subclass would only see task outlets and
REST API events. Listeners are Airflow's documented extension point (an ``airflow.plugins``
entry point of this distribution).

The **sweep**, in the scheduler's transaction (``on_dag_run_running`` / ``_success`` /
``_failed`` of an asset-triggered run), re-creates the ADRQ row core would have created had a
stranded event been the first of its asset. It first takes the lock core's run creation takes
for the Dag (the ``dag`` row, ``FOR NO KEY UPDATE SKIP LOCKED`` in
``DagModel.dags_needing_dagruns``) and keeps it until the scheduler commits: with several
schedulers, no run of the Dag is created between the sweep's reads and the commit of its rows,
so what it reads as unconsumed is not being consumed by another scheduler at the same time, and
every run created after it sees its rows.

Why no queue row is ever moved forward: an asset event's timestamp is taken in its writer's
process at flush, before its ``INSERT`` reaches the database. A row moved to "now" by another
event's transaction can pass an event that is stamped but not yet written (nothing in the
database shows it, not even a lock); the run created from that row then has a ``run_after``
above the event, which, once committed, is below every later run's window and the sweep's
floor: in no run ever, where core would have consumed it with its next run. The sweep only
inserts rows where core has none, for events already committed.

From there the scheduler does everything as usual: it evaluates the Dag's asset condition,
honours ``max_active_runs``, locks the rows (``FOR UPDATE SKIP LOCKED`` on PostgreSQL), picks the
event window and consumes the events.

Guarantees:

* it only ever inserts ADRQ rows where the Dag has none for the asset, never moves one, creates
  runs nor links events: no duplicate run and no event consumed twice can come from it (the next run's
  window starts at the newest ``run_after`` of the Dag's asset-triggered runs, above every
  consumed event; with several schedulers, because of the lock below);
* several schedulers: the sweep and the creation of a run of the same Dag exclude each other
  (the Dag's row lock, held to the scheduler's commit). A sweep that finds the row locked does
  nothing: the holder is creating a run (whose own start and end sweep again), sweeping, or
  another writer of the Dag's row (then the tail waits for the next sweep or the next event);
* the insert is conflict-free (``ON CONFLICT DO NOTHING``) in a connection-level savepoint of
  the scheduler's own transaction: a triggerer inserting the same row cannot make it fail, and
  a failure never breaks the scheduler's transaction;
* its ``created_at`` is the later of now and the newest stranded event (a triggerer's clock may
  be ahead of the scheduler's), above the ``run_after`` of every asset-triggered run of the Dag
  (read under the lock): the next run's window starts at the newest of them and holds every
  stranded event, never an earlier run's;
* manual and scheduled runs do not move the floor: core's event window ignores them too;
* where nothing is stranded it inserts nothing (one read of the Dag's newest events);
* on an Airflow whose ADRQ rows reference their asset event (the upstream fix) it does nothing;
* off unless ``[shared_stream] requeue_stranded_asset_events = True``.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Collection, Iterator, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

from airflow.listeners import hookimpl
from airflow.plugins_manager import AirflowPlugin

from airflow_shared_stream.placement import PlacementListener

if TYPE_CHECKING:
    from sqlalchemy.orm import Session

log = logging.getLogger(__name__)

CONFIG_SECTION = "shared_stream"
CONFIG_KEY = "requeue_stranded_asset_events"
"""``[shared_stream] requeue_stranded_asset_events``.

Environment: ``AIRFLOW__SHARED_STREAM__REQUEUE_STRANDED_ASSET_EVENTS=True``.
"""

UPSTREAM_FIX_COLUMN = "asset_event_id"
"""The ADRQ column apache/airflow#70972 adds: with it, every event has its own queue row."""


@dataclass(frozen=True, slots=True)
class StrandedAsset:
    """An asset whose newer events no run consumed and no queue row will bring to one."""

    asset_id: int
    newest_event: datetime
    events: int


def upstream_fix_present(adrq_columns: Collection[str]) -> bool:
    """Whether this Airflow queues one ADRQ row per asset event (apache/airflow#70972)."""
    return UPSTREAM_FIX_COLUMN in adrq_columns


def stranded_assets(
    unconsumed_events: Mapping[int, tuple[datetime, int]], queued_asset_ids: Collection[int]
) -> list[StrandedAsset]:
    """
    The assets to re-queue: they have unconsumed events newer than the Dag's last asset-triggered
    run and no ADRQ row. An asset that has a row is left alone: the scheduler will consume its
    events with the next run already.

    :param unconsumed_events: asset id -> (newest timestamp, count) of its events newer than the
        Dag's newest asset-triggered ``run_after`` and consumed by none of the Dag's runs.
    :param queued_asset_ids: assets that have an ADRQ row for the Dag.
    """
    queued = set(queued_asset_ids)
    return [
        StrandedAsset(asset_id=asset_id, newest_event=newest, events=count)
        for asset_id, (newest, count) in sorted(unconsumed_events.items())
        if asset_id not in queued and count > 0
    ]


def is_enabled() -> bool:
    """The setting is on and this Airflow still has the stranding (no upstream fix)."""
    from airflow.configuration import conf
    from airflow.models.asset import AssetDagRunQueue

    if not conf.getboolean(CONFIG_SECTION, CONFIG_KEY, fallback=False):
        return False
    return not upstream_fix_present(AssetDagRunQueue.__table__.columns.keys())


def requeue_stranded_asset_events(dag_id: str, *, session: Session) -> list[StrandedAsset]:
    """
    Insert the ADRQ rows of ``dag_id``'s stranded assets, in ``session``'s transaction.

    Only for an unpaused, non-partitioned Dag that has had an asset-triggered run (before its
    first one, core's own catch-up floor decides which events count). Events reach the Dag
    through ``DagScheduleAssetReference`` (the assets named in its schedule); events that reach
    it only through an asset alias are not looked at.

    Locks the Dag's row as core does before it creates an asset-triggered run (``SKIP LOCKED``:
    the scheduler never waits here, so it can never deadlock with another scheduler's sweep),
    and reads after the lock: each read (READ COMMITTED) then sees every run committed before,
    and no run of the Dag can be created until ``session`` commits the rows inserted here.
    """
    from airflow._shared.timezones import timezone
    from airflow.models.dag import DagModel
    from airflow.utils.sqlalchemy import with_row_locks
    from sqlalchemy import select

    dag = session.execute(
        with_row_locks(
            select(DagModel.is_paused, DagModel.timetable_partitioned).where(DagModel.dag_id == dag_id),
            of=DagModel,
            session=session,
            skip_locked=True,
        )
    ).one_or_none()
    if dag is None:  # no such Dag, or another scheduler is creating its run or sweeping it
        return []
    if dag.is_paused or dag.timetable_partitioned:
        return []
    floor = asset_triggered_floor(dag_id, session=session)
    if floor is None:
        return []
    unconsumed = unconsumed_asset_events(dag_id, floor, session=session)
    if not unconsumed:
        return []
    stranded = stranded_assets(unconsumed, queued_asset_ids(dag_id, session=session))
    if stranded:
        queued_at = max(timezone.utcnow(), *(s.newest_event for s in stranded))
        _insert_ignoring_conflicts(
            session,
            [{"asset_id": s.asset_id, "target_dag_id": dag_id, "created_at": queued_at} for s in stranded],
        )
    return stranded


def asset_triggered_floor(dag_id: str, *, session: Session) -> datetime | None:
    """The newest ``run_after`` of ``dag_id``'s asset-triggered runs: core's event window starts there."""
    from airflow.models.dagrun import DagRun
    from airflow.utils.types import DagRunType
    from sqlalchemy import func, select

    return session.scalar(
        select(func.max(DagRun.run_after)).where(
            DagRun.dag_id == dag_id, DagRun.run_type == DagRunType.ASSET_TRIGGERED
        )
    )


def unconsumed_asset_events(
    dag_id: str, floor: datetime, *, session: Session
) -> dict[int, tuple[datetime, int]]:
    """
    Asset id -> (newest timestamp, count) of the events of ``dag_id``'s schedule assets newer than
    ``floor`` that none of its runs consumed (one grouped read).
    """
    from airflow.models.asset import AssetEvent, DagScheduleAssetReference
    from airflow.models.asset import association_table as dagrun_asset_event
    from airflow.models.dagrun import DagRun
    from sqlalchemy import and_, exists, func, select

    consumed_by_this_dag = exists().where(
        dagrun_asset_event.c.event_id == AssetEvent.id,
        dagrun_asset_event.c.dag_run_id == DagRun.id,
        DagRun.dag_id == dag_id,
    )
    rows = session.execute(
        select(AssetEvent.asset_id, func.max(AssetEvent.timestamp), func.count())
        .where(
            AssetEvent.asset_id.in_(
                select(DagScheduleAssetReference.asset_id).where(DagScheduleAssetReference.dag_id == dag_id)
            ),
            and_(AssetEvent.timestamp > floor, AssetEvent.partition_key.is_(None)),
            ~consumed_by_this_dag,
        )
        .group_by(AssetEvent.asset_id)
    ).all()
    return {r[0]: (r[1], r[2]) for r in rows}


def queued_asset_ids(dag_id: str, *, session: Session) -> list[int]:
    """Assets that have an ADRQ row for ``dag_id`` (the scheduler will consume their events)."""
    from airflow.models.asset import AssetDagRunQueue
    from sqlalchemy import select

    return list(
        session.scalars(select(AssetDagRunQueue.asset_id).where(AssetDagRunQueue.target_dag_id == dag_id))
    )


def _insert_ignoring_conflicts(session: Session, values: list[dict[str, Any]]) -> None:
    """``INSERT ... ON CONFLICT DO NOTHING`` on the dialects Airflow supports."""
    from airflow.models.asset import AssetDagRunQueue
    from airflow.utils.sqlalchemy import get_dialect_name
    from sqlalchemy import insert

    dialect = get_dialect_name(session)
    if dialect == "postgresql":
        from sqlalchemy.dialects.postgresql import insert as pg_insert

        stmt: Any = pg_insert(AssetDagRunQueue).on_conflict_do_nothing()
    elif dialect == "sqlite":
        from sqlalchemy.dialects.sqlite import insert as sqlite_insert

        stmt = sqlite_insert(AssetDagRunQueue).on_conflict_do_nothing()
    else:  # MySQL
        stmt = insert(AssetDagRunQueue).prefix_with("IGNORE")
    session.execute(stmt, values)


@contextlib.contextmanager
def _savepoint(session: Session) -> Iterator[None]:
    """
    A SAVEPOINT on the session's connection, so a failure here never breaks the caller's
    transaction (on PostgreSQL a failed statement aborts the whole transaction otherwise).

    Not ``Session.begin_nested()``: the scheduler runs the listeners inside ``prohibit_commit``,
    whose guard fails any commit of the session, the release of a Session-level savepoint
    included. Pending ORM changes of the caller are flushed first, outside the savepoint, so
    rolling it back can only undo this module's own statements.
    """
    session.flush()
    with session.connection().begin_nested():
        yield


class StrandedAssetEventsListener:
    """
    Scheduler listener: after an asset-triggered run starts or ends, re-queue what it left behind.

    Called by ``DagRun.notify_dagrun_state_changed`` in the scheduler's transaction (the session
    of the ``dag_run`` object), which commits our rows together with the state change. Errors
    are logged and rolled back to a savepoint: a listener must never break the scheduler.
    """

    def _sweep(self, dag_run: Any) -> None:
        from airflow.utils.types import DagRunType
        from sqlalchemy.orm import object_session

        if dag_run.run_type != DagRunType.ASSET_TRIGGERED or not is_enabled():
            return
        session = object_session(dag_run)
        if session is None:
            log.warning("Dag run %s has no session; cannot re-queue its stranded events", dag_run.run_id)
            return
        try:
            with _savepoint(session):
                stranded = requeue_stranded_asset_events(dag_run.dag_id, session=session)
        except Exception:
            log.exception("Could not re-queue stranded asset events of Dag %s", dag_run.dag_id)
            return
        if stranded:
            log.info(
                "Re-queued Dag %s for %d stranded asset events of assets %s (apache/airflow#56050)",
                dag_run.dag_id,
                sum(s.events for s in stranded),
                [s.asset_id for s in stranded],
            )

    # The hook names and signatures are Airflow's listener spec (airflow.listeners.spec.dagrun).
    @hookimpl
    def on_dag_run_running(self, dag_run: Any, msg: str) -> None:
        self._sweep(dag_run)

    @hookimpl
    def on_dag_run_success(self, dag_run: Any, msg: str) -> None:
        self._sweep(dag_run)

    @hookimpl
    def on_dag_run_failed(self, dag_run: Any, msg: str) -> None:
        self._sweep(dag_run)


class SharedStreamSchedulingPlugin(AirflowPlugin):
    """
    Registers this provider's listeners (entry point ``airflow.plugins``): the sweep above, off
    unless enabled, and the triggerer placement check (:mod:`airflow_shared_stream.placement`).
    """

    name = "shared_stream_scheduling"
    listeners = [StrandedAssetEventsListener(), PlacementListener()]
