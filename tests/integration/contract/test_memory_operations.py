"""
The example broker of docs/writing-a-broker.rst, registered by one line: on the Streams page, and redriven.

Its operator features are its own file (docs/examples/memory_operations.py); the only line
outside its folder is the registry's (:data:`airflow_shared_stream.brokers.REGISTRY`), added
here. The Streams page is asked through the console's own FastAPI app, on Airflow's real
metadata schema (``airflow db migrate``, SQLite), with Airflow's simple auth manager; the redrive
runs through ``RedriveDeadLettersOperator``.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from airflow_shared_stream import brokers
from airflow_shared_stream.brokers import RegisteredBroker
from docs.examples.memory_broker import NAMESPACES, MemoryQueue, MemorySharedStreamTrigger

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

NAMESPACE = "operations"
MEMORY = RegisteredBroker("memory", "Memory", "docs.examples.memory_operations")


@pytest.fixture
def memory_broker(monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, MemoryQueue]]:
    """The example broker, registered (its one line), with a queue and its dead-letter queue."""
    monkeypatch.setattr(brokers, "REGISTRY", (*brokers.REGISTRY, MEMORY))
    connection = {"conn_type": "generic", "host": NAMESPACE, "password": "example-token"}
    monkeypatch.setenv("AIRFLOW_CONN_MEMORY_DEFAULT", json.dumps(connection))
    queues = NAMESPACES.setdefault(NAMESPACE, {})
    queues["orders"] = MemoryQueue(30)
    queues["orders-dlq"] = MemoryQueue(30)
    yield queues
    NAMESPACES.pop(NAMESPACE, None)


def test_a_redrive_moves_the_example_brokers_dead_letters_home(memory_broker: dict[str, MemoryQueue]) -> None:
    from airflow_shared_stream.redrive import RedriveDeadLettersOperator

    for n in range(3):
        memory_broker["orders-dlq"].send(json.dumps({"n": n}).encode())
    memory_broker["orders-dlq"].send(json.dumps({"n": 9, "keep": True}).encode())

    summary = RedriveDeadLettersOperator(
        task_id="redrive",
        broker="memory",
        source="orders",
        dead_letter="orders-dlq",
        filter="body.n != `9`",
    ).execute({})

    assert (summary["moved"], summary["skipped"], summary["snapshot"]) == (3, 1, 4)
    assert sorted(json.loads(b)["n"] for b in memory_broker["orders"].take_all()) == [0, 1, 2]
    assert [json.loads(b) for b in memory_broker["orders-dlq"].take_all()] == [{"n": 9, "keep": True}]


def test_an_unregistered_broker_is_refused_by_name() -> None:
    from airflow_shared_stream.common.redrive import RedriveConfigurationError
    from airflow_shared_stream.redrive import dead_letter_source

    with pytest.raises(
        RedriveConfigurationError, match="broker must be one of kafka, sqs, pubsub, servicebus"
    ):
        dead_letter_source("memory", source="orders", dead_letter="orders-dlq")


def test_the_example_broker_needs_its_dead_letter_queue_named(memory_broker: dict[str, MemoryQueue]) -> None:
    from airflow_shared_stream.common.redrive import RedriveConfigurationError
    from airflow_shared_stream.redrive import dead_letter_source

    with pytest.raises(RedriveConfigurationError, match="where the dead letters are"):
        dead_letter_source("memory", source="orders")


def _migrate(url: str, home: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIRFLOW")}
    env.update(
        AIRFLOW_HOME=str(home), AIRFLOW__DATABASE__SQL_ALCHEMY_CONN=url, AIRFLOW__CORE__LOAD_EXAMPLES="False"
    )
    result = subprocess.run(
        [str(Path(sys.executable).parent / "airflow"), "db", "migrate"],
        env=env,
        capture_output=True,
        text=True,
        timeout=500,
        check=False,
    )
    if result.returncode != 0:
        raise RuntimeError(f"airflow db migrate failed:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}")


@pytest.fixture
def metadata_db(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Airflow's ORM on a freshly migrated SQLite database, for this test only."""
    from airflow import settings
    from airflow.configuration import conf

    url = f"sqlite:///{tmp_path / 'airflow.db'}"
    _migrate(url, tmp_path)
    previous = conf.get("database", "sql_alchemy_conn")
    monkeypatch.setenv("AIRFLOW__DATABASE__SQL_ALCHEMY_CONN", url)
    conf.set("database", "sql_alchemy_conn", url)
    settings.SQL_ALCHEMY_CONN = url
    settings.configure_orm()
    try:
        yield
    finally:
        conf.set("database", "sql_alchemy_conn", previous)
        settings.SQL_ALCHEMY_CONN = previous
        settings.configure_orm()


def _watch(dag_id: str, trigger: MemorySharedStreamTrigger) -> None:
    """What the Dag processor writes for a Dag whose asset a watcher of ``trigger`` watches."""
    from airflow.models.asset import AssetModel, AssetWatcherModel, DagScheduleAssetReference
    from airflow.models.dag import DagModel
    from airflow.models.dagbundle import DagBundleModel
    from airflow.models.trigger import Trigger
    from airflow.utils.session import create_session

    classpath, kwargs = trigger.serialize()
    with create_session() as session:
        session.add(DagBundleModel(name="bundle"))
        session.flush()
        session.add(DagModel(dag_id=dag_id, bundle_name="bundle", is_paused=False, is_stale=False))
        asset = AssetModel(name=f"{dag_id}-orders", uri=f"memory://{dag_id}/orders", group="asset")
        row = Trigger(classpath=classpath, kwargs=kwargs)
        session.add_all([asset, row])
        session.flush()
        session.add(AssetWatcherModel(name=f"{dag_id}_watcher", asset_id=asset.id, trigger_id=row.id))
        session.add(DagScheduleAssetReference(asset_id=asset.id, dag_id=dag_id))


async def _streams_page() -> dict[str, Any]:
    """``GET /api/streams`` of the console's app, as an admin of Airflow's simple auth manager."""
    from airflow.api_fastapi.app import create_auth_manager
    from airflow.api_fastapi.auth.managers.simple.user import SimpleAuthManagerUser
    from airflow.api_fastapi.core_api.security import get_user

    from airflow_shared_stream.console.api import create_app

    create_auth_manager()
    app = create_app()
    app.dependency_overrides[get_user] = lambda: SimpleAuthManagerUser(username="admin", role="admin")
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://console") as client:
        answer = await client.get("/api/streams")
    assert answer.status_code == 200, answer.text
    found: dict[str, Any] = answer.json()
    return found


def test_the_example_broker_is_on_the_streams_page_with_its_backlog(
    memory_broker: dict[str, MemoryQueue], metadata_db: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(
        "AIRFLOW__CORE__AUTH_MANAGER",
        "airflow.api_fastapi.auth.managers.simple.simple_auth_manager.SimpleAuthManager",
    )
    for n in range(2):
        memory_broker["orders"].send(json.dumps({"n": n}).encode())
    for n in range(3):
        memory_broker["orders-dlq"].send(json.dumps({"n": n}).encode())
    _watch(
        f"orders_{uuid.uuid4().hex[:6]}", MemorySharedStreamTrigger("orders", dead_letter_queue="orders-dlq")
    )

    page = asyncio.run(_streams_page())

    (stream,) = [s for s in page["streams"] if s["broker"] == "memory"]
    assert stream["upstream"] == {"queue": "orders"}
    assert (stream["connection_id"], stream["dead_letter"]) == ("memory_default", "orders-dlq")
    assert stream["backlog"]["source"] == {"visible": 2, "in_flight": 0, "depth": 2}
    assert stream["backlog"]["dead_letter"] == {"visible": 3, "in_flight": 0, "depth": 3}
    assert stream["redrive_available"] is True
    assert memory_broker["orders-dlq"].count() == 3  # counted, nothing received
