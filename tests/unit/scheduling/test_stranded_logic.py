"""Pure logic of the stranded-asset-events mitigation (airflow_shared_stream/scheduling.py)."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from airflow_shared_stream import scheduling
from airflow_shared_stream.scheduling import StrandedAsset, stranded_assets, upstream_fix_present

T0 = datetime(2026, 11, 22, 4, 0, tzinfo=timezone.utc)


def test_an_asset_with_newer_events_and_no_queue_row_is_stranded() -> None:
    got = stranded_assets({1: (T0, 3)}, queued_asset_ids=[])
    assert got == [StrandedAsset(asset_id=1, newest_event=T0, events=3)]


def test_an_asset_that_still_has_its_queue_row_is_left_to_the_scheduler() -> None:
    assert stranded_assets({1: (T0, 3), 2: (T0 + timedelta(seconds=1), 1)}, queued_asset_ids=[1]) == [
        StrandedAsset(asset_id=2, newest_event=T0 + timedelta(seconds=1), events=1)
    ]


def test_nothing_unconsumed_means_nothing_to_do() -> None:
    assert stranded_assets({}, queued_asset_ids=[]) == []
    assert stranded_assets({1: (T0, 0)}, queued_asset_ids=[]) == []


def test_the_upstream_fix_is_recognised_by_its_queue_column() -> None:
    assert not upstream_fix_present(["asset_id", "target_dag_id", "created_at"])
    assert upstream_fix_present(["asset_event_id", "target_dag_id", "created_at"])


def test_installed_airflow_still_has_the_stranding() -> None:
    """If this fails, Airflow queues one row per event: the mitigation is a no-op; say so in the docs."""
    from airflow.models.asset import AssetDagRunQueue

    assert not upstream_fix_present(AssetDagRunQueue.__table__.columns.keys())


@pytest.mark.parametrize(
    ("setting", "fixed", "expected"),
    [("True", False, True), ("False", False, False), (None, False, False), ("True", True, False)],
)
def test_enabled_only_by_the_setting_and_only_without_the_upstream_fix(
    monkeypatch: pytest.MonkeyPatch, setting: str | None, fixed: bool, expected: bool
) -> None:
    env = "AIRFLOW__SHARED_STREAM__REQUEUE_STRANDED_ASSET_EVENTS"
    if setting is None:
        monkeypatch.delenv(env, raising=False)
    else:
        monkeypatch.setenv(env, setting)
    monkeypatch.setattr(scheduling, "upstream_fix_present", lambda columns: fixed)
    assert scheduling.is_enabled() is expected


def test_the_plugin_registers_its_listeners_with_airflow_hook_names() -> None:
    names = {
        name
        for listener in scheduling.SharedStreamSchedulingPlugin.listeners
        for name in dir(listener)
        if name.startswith("on_")
    }
    # No on_asset_event_emitted: the queue row is never moved forward (docs/pipelines.rst).
    assert names == {
        "on_dag_run_running",
        "on_dag_run_success",
        "on_dag_run_failed",
        "on_starting",  # the triggerer placement check (airflow_shared_stream/placement.py)
    }


def test_the_plugin_is_an_airflow_plugins_entry_point() -> None:
    from importlib.metadata import entry_points

    found = {ep.value for ep in entry_points(group="airflow.plugins")}
    assert "airflow_shared_stream.scheduling:SharedStreamSchedulingPlugin" in found
