"""
A driver the master forgot is never submitted again without the user's say-so.

A real standalone master with ``spark.deploy.retainedDrivers=1``: once a second driver
completes, the first is evicted and the status API answers that it does not know it, exactly as
a busy master does after a triggerer outage (or a master restarted without recovery does for
every driver). The first driver may well have succeeded, so a retry must not run it again.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from airflow.sdk.exceptions import AirflowException, AirflowFailException, TaskDeferred

from airflow_shared_stream.spark.operators import DeferrableSparkSubmitOperator
from airflow_shared_stream.spark.triggers import SparkApplicationTrigger
from tests.integration.spark.conftest import APPS
from tests.support.spark import MemoryTaskStateStore, SparkCluster, spark_standalone_cluster
from tests.support.waiting import eventually

pytestmark = pytest.mark.integration

CONN_ID = "spark_forgetful"
SMALL = {"spark.ui.enabled": "false", "spark.driver.memory": "512m"}


@pytest.fixture(scope="module")
def forgetful(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SparkCluster]:
    """A master that keeps only the last completed driver."""
    with spark_standalone_cluster(
        tmp_path_factory.mktemp("spark-forgetful"), worker_cores=1, worker_memory="2g", retained_drivers=1
    ) as cluster:
        yield cluster


@pytest.fixture
def conn_id(forgetful: SparkCluster, monkeypatch: pytest.MonkeyPatch) -> str:
    ui = {"master-ui-url": f"http://127.0.0.1:{forgetful.master_ui_port}"}
    monkeypatch.setenv(f"AIRFLOW_CONN_{CONN_ID.upper()}", forgetful.connection_json(**ui))
    return CONN_ID


def _operator(tmp_name: str, **kwargs: Any) -> DeferrableSparkSubmitOperator:
    return DeferrableSparkSubmitOperator(
        task_id="spark",
        conn_id=CONN_ID,
        deferrable=True,
        conf=dict(SMALL),
        application=str(APPS / "hello.py"),
        application_args=[tmp_name],
        **kwargs,
    )


def _drivers(cluster: SparkCluster) -> dict[str, str]:
    state = cluster.master_state()
    return {d["id"]: d["state"] for d in state.get("activedrivers", []) + state.get("completeddrivers", [])}


def _known(cluster: SparkCluster, driver_id: str) -> bool:
    resp = httpx.get(
        f"{cluster.rest_url}/v1/submissions/status/{driver_id}",
        headers={"Authorization": f"Bearer {cluster.token}"},
        timeout=10,
    )
    return bool(resp.json().get("success"))


async def _finish(cluster: SparkCluster, driver_id: str) -> None:
    await eventually(
        lambda: _drivers(cluster).get(driver_id),
        lambda state: state == "FINISHED",
        timeout=180,
        what=f"driver {driver_id} to finish",
    )


def _submit(op: DeferrableSparkSubmitOperator, store: MemoryTaskStateStore) -> str:
    with pytest.raises(TaskDeferred) as deferred:
        op.execute({"task_state_store": store})
    trigger = deferred.value.trigger
    assert isinstance(trigger, SparkApplicationTrigger)
    return trigger.submission_id


async def _forgotten_driver(cluster: SparkCluster, tmp_path: Any) -> tuple[MemoryTaskStateStore, str]:
    """Attempt 1 submits and its driver succeeds; another driver completes; the master forgets it."""
    store = MemoryTaskStateStore()
    first = _submit(_operator(str(tmp_path / "first")), store)
    await _finish(cluster, first)
    other = _submit(_operator(str(tmp_path / "other")), MemoryTaskStateStore())
    await _finish(cluster, other)
    await eventually(
        lambda: _known(cluster, first),
        lambda known: not known,
        timeout=60,
        what=f"the master to forget {first}",
    )
    assert (tmp_path / "first").read_text() == "hello from the driver\n", "the first attempt's driver ran"
    return store, first


async def test_a_retry_never_resubmits_a_driver_the_master_forgot(forgetful, conn_id, tmp_path):
    store, first = await _forgotten_driver(forgetful, tmp_path)
    # The trigger of attempt 1 (a triggerer outage) finds the driver unknown: the attempt fails.
    event = await asyncio.wait_for(
        _first_event(SparkApplicationTrigger(submission_id=first, conn_id=conn_id, poll_interval=0.5)), 60
    )
    assert event["status"] == "error", event
    with pytest.raises(AirflowException, match="does not know submission"):
        _operator("x").execute_complete({}, event)

    # The retry: the application succeeded, but nobody can tell. It must not run again.
    before = set(_drivers(forgetful))
    with pytest.raises(AirflowFailException, match="retainedDrivers") as refused:
        _operator(str(tmp_path / "again")).execute({"task_state_store": store})
    assert first in str(refused.value)
    assert "on_unknown_outcome='resubmit'" in str(refused.value)
    assert set(_drivers(forgetful)) == before, "the retry submitted the application again"
    assert not (tmp_path / "again").exists()
    assert store.get("spark_job_id") == first


async def test_a_user_who_chose_resubmit_gets_a_new_driver(forgetful, conn_id, tmp_path):
    store, first = await _forgotten_driver(forgetful, tmp_path)
    resubmitted = _submit(_operator(str(tmp_path / "again"), on_unknown_outcome="resubmit"), store)
    assert resubmitted != first
    assert store.get("spark_job_id") == resubmitted
    await _finish(forgetful, resubmitted)


async def _first_event(trigger: SparkApplicationTrigger) -> dict[str, Any]:
    async for event in trigger.run():
        return event.payload
    raise AssertionError("trigger ended without an event")


def test_on_unknown_outcome_is_checked():
    with pytest.raises(ValueError, match="on_unknown_outcome"):
        _operator("x", on_unknown_outcome="retry")
    assert _operator("x").on_unknown_outcome == "fail"
