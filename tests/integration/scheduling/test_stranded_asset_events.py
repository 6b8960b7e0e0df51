"""
The stranded-asset-events mitigation on Airflow's real schema, SQLite and PostgreSQL.

Events are registered with Airflow's own ``AssetManager.register_asset_change`` (the call
``Trigger.submit_event`` makes for a watcher's event), so the queue rows are the ones core
writes; the listeners run because the plugin is installed (entry point ``airflow.plugins``).
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime, timedelta

import pytest
from sqlalchemy import select, text

from airflow_shared_stream import scheduling

pytestmark = pytest.mark.integration

DAG_ID = "orders_pipeline"
ASSET = ("orders_created", "kafka://orders/created")
SETTING = "AIRFLOW__SHARED_STREAM__REQUEUE_STRANDED_ASSET_EVENTS"


@pytest.fixture
def world(metadata_db: str) -> Iterator[dict[str, int]]:
    """One unpaused asset-scheduled Dag on one asset, as the dag-processor would leave them."""
    from airflow import settings
    from airflow.models.asset import AssetActive, AssetModel, DagScheduleAssetReference
    from airflow.models.dag import DagModel
    from airflow.models.dagbundle import DagBundleModel

    session = settings.Session()
    session.add(DagBundleModel(name="bundle"))
    session.flush()
    session.add(
        DagModel(
            dag_id=DAG_ID,
            bundle_name="bundle",
            is_paused=False,
            is_stale=False,
            max_active_runs=1,
            max_active_tasks=16,
            max_consecutive_failed_dag_runs=0,
            has_task_concurrency_limits=False,
            timetable_type="airflow.timetables.simple.AssetTriggeredTimetable",
        )
    )
    asset = AssetModel(name=ASSET[0], uri=ASSET[1], group="asset")
    session.add(asset)
    session.flush()
    session.add(AssetActive.for_asset(asset))
    session.add(DagScheduleAssetReference(asset_id=asset.id, dag_id=DAG_ID))
    session.commit()
    yield {"asset_id": asset.id}
    session.close()


def _listeners_loaded() -> None:
    from airflow.listeners.listener import get_listener_manager

    kinds = {type(p).__name__ for p in get_listener_manager().pm.get_plugins()}
    assert "StrandedAssetEventsListener" in kinds, kinds
    assert "QueuedAssetRefreshListener" not in kinds, kinds


def _watcher_event(payload: int, *, from_trigger: bool = True) -> datetime:
    """Persist one event as the triggerer does (one transaction per event); return its timestamp."""
    from airflow import settings
    from airflow.assets.manager import AssetManager
    from airflow.serialization.definitions.assets import SerializedAssetUniqueKey

    session = settings.Session()
    extra = {"from_trigger": True, "payload": payload} if from_trigger else {"payload": payload}
    event = AssetManager.register_asset_change(
        asset=SerializedAssetUniqueKey(name=ASSET[0], uri=ASSET[1]), extra=extra, session=session
    )
    assert event is not None
    timestamp = event.timestamp
    session.commit()
    return timestamp


def _queue_row_time() -> datetime | None:
    from airflow import settings
    from airflow.models.asset import AssetDagRunQueue

    session = settings.Session()
    try:
        return session.scalar(
            select(AssetDagRunQueue.created_at).where(AssetDagRunQueue.target_dag_id == DAG_ID)
        )
    finally:
        session.rollback()


def test_without_the_setting_core_leaves_the_second_event_after_the_queue_time(
    world: dict[str, int], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The stranding itself (apache/airflow#56050): if this fails, core changed; revisit the mitigation."""
    monkeypatch.delenv(SETTING, raising=False)
    _listeners_loaded()
    _watcher_event(1)
    queued_at = _queue_row_time()
    second = _watcher_event(2)
    assert _queue_row_time() == queued_at
    # The scheduler's next run takes events up to the queue time: the second one is not in it.
    assert queued_at is not None
    assert second > queued_at


def test_with_the_setting_a_watcher_event_leaves_the_queue_time_to_core(
    world: dict[str, int], monkeypatch: pytest.MonkeyPatch
) -> None:
    """
    Issue 46 item 10: no event moves a queue row forward (it could pass an event stamped in
    another process but not yet written); the sweep brings the tail instead.
    """
    monkeypatch.setenv(SETTING, "True")
    _listeners_loaded()
    _watcher_event(1)
    queued_at = _queue_row_time()
    for payload in range(2, 6):
        _watcher_event(payload)
        assert _queue_row_time() == queued_at


def test_events_that_no_trigger_created_keep_core_behaviour(
    world: dict[str, int], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(SETTING, "True")
    _watcher_event(1, from_trigger=False)
    queued_at = _queue_row_time()
    _watcher_event(2, from_trigger=False)
    assert _queue_row_time() == queued_at


def _asset_triggered_run(run_after: datetime, consumed: list[int] = ()) -> None:  # type: ignore[assignment]
    from airflow import settings
    from airflow.models.asset import AssetEvent
    from airflow.models.dagrun import DagRun
    from airflow.utils.state import DagRunState
    from airflow.utils.types import DagRunTriggeredByType, DagRunType

    session = settings.Session()
    run = DagRun(
        dag_id=DAG_ID,
        run_id=f"asset_triggered__{run_after.isoformat()}",
        run_after=run_after,
        run_type=DagRunType.ASSET_TRIGGERED,
        triggered_by=DagRunTriggeredByType.ASSET,
        state=DagRunState.RUNNING,
    )
    session.add(run)
    session.flush()
    run.consumed_asset_events.extend(session.scalars(select(AssetEvent).where(AssetEvent.id.in_(consumed))))
    session.commit()


def _event_ids() -> list[int]:
    from airflow import settings
    from airflow.models.asset import AssetEvent

    session = settings.Session()
    try:
        return list(session.scalars(select(AssetEvent.id).order_by(AssetEvent.id)))
    finally:
        session.rollback()


def _sweep() -> list[scheduling.StrandedAsset]:
    from airflow import settings

    session = settings.Session()
    stranded = scheduling.requeue_stranded_asset_events(DAG_ID, session=session)
    session.commit()
    return stranded


def _clear_queue() -> None:
    from airflow import settings

    session = settings.Session()
    session.execute(text("DELETE FROM asset_dag_run_queue"))
    session.commit()


def test_the_sweep_requeues_events_newer_than_the_last_run_once(
    world: dict[str, int], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(SETTING, raising=False)  # events as core queues them
    first = _watcher_event(1)
    second = _watcher_event(2)
    third = _watcher_event(3)
    # The run core created from the first event's row consumed the first event only ...
    _asset_triggered_run(run_after=first, consumed=_event_ids()[:1])
    _clear_queue()  # ... and deleted the row: the second and third events are stranded.
    assert _queue_row_time() is None

    stranded = _sweep()
    assert [(s.asset_id, s.events, s.newest_event) for s in stranded] == [(world["asset_id"], 2, third)]
    queued_at = _queue_row_time()
    assert queued_at is not None
    assert queued_at >= third > second
    # Idempotent: the row is there now; a second sweep (another scheduler) adds nothing.
    assert _sweep() == []
    assert _queue_row_time() == queued_at


def test_the_sweep_does_nothing_when_nothing_is_stranded(world: dict[str, int]) -> None:
    first = _watcher_event(1)
    second = _watcher_event(2)
    _asset_triggered_run(run_after=second, consumed=_event_ids())
    _clear_queue()
    assert _sweep() == []
    assert _queue_row_time() is None
    assert first < second


def test_the_sweep_ignores_events_a_run_consumed_even_after_its_run_after(world: dict[str, int]) -> None:
    first = _watcher_event(1)
    _watcher_event(2)
    _asset_triggered_run(run_after=first - timedelta(seconds=1), consumed=_event_ids())
    _clear_queue()
    assert _sweep() == []


def test_the_sweep_leaves_a_paused_dag_alone(world: dict[str, int]) -> None:
    from airflow import settings

    first = _watcher_event(1)
    _watcher_event(2)
    _asset_triggered_run(run_after=first, consumed=_event_ids()[:1])
    _clear_queue()
    session = settings.Session()
    session.execute(text("UPDATE dag SET is_paused = :p WHERE dag_id = :d"), {"p": True, "d": DAG_ID})
    session.commit()
    assert _sweep() == []


def test_the_scheduler_listener_requeues_inside_the_schedulers_commit_guard(
    world: dict[str, int], monkeypatch: pytest.MonkeyPatch
) -> None:
    """
    The scheduler calls ``on_dag_run_running`` inside ``prohibit_commit``, whose guard raises on
    any commit of the session, a Session-level savepoint's release included: the listener must
    write without one, and leave the scheduler's transaction for the scheduler to commit.
    """
    from airflow import settings
    from airflow.models.dagrun import DagRun
    from airflow.utils.sqlalchemy import prohibit_commit

    monkeypatch.delenv(SETTING, raising=False)
    first = _watcher_event(1)
    _watcher_event(2)
    _asset_triggered_run(run_after=first, consumed=_event_ids()[:1])
    _clear_queue()
    monkeypatch.setenv(SETTING, "True")

    session = settings.Session()
    run = session.scalar(select(DagRun).where(DagRun.dag_id == DAG_ID))
    with prohibit_commit(session) as guard:
        scheduling.StrandedAssetEventsListener().on_dag_run_running(dag_run=run, msg="started")
        guard.commit()
    assert _queue_row_time() is not None


def test_a_manual_run_dated_after_the_stranded_events_does_not_hide_them(world: dict[str, int]) -> None:
    """Core's event window starts at the newest asset-triggered run: a manual run is no floor."""
    from airflow import settings
    from airflow._shared.timezones import timezone
    from airflow.models.dagrun import DagRun
    from airflow.utils.state import DagRunState
    from airflow.utils.types import DagRunTriggeredByType, DagRunType

    first = _watcher_event(1)
    stranded = _watcher_event(2)
    _asset_triggered_run(run_after=first, consumed=_event_ids()[:1])
    _clear_queue()
    session = settings.Session()
    manual_after = timezone.utcnow()
    session.add(
        DagRun(
            dag_id=DAG_ID,
            run_id=f"manual__{manual_after.isoformat()}",
            run_after=manual_after,
            run_type=DagRunType.MANUAL,
            triggered_by=DagRunTriggeredByType.REST_API,
            state=DagRunState.RUNNING,
        )
    )
    session.commit()
    assert manual_after > stranded
    assert [(s.events, s.newest_event) for s in _sweep()] == [(1, stranded)]
