"""
Airflow's real metadata schema, migrated by ``airflow db migrate``, on SQLite and on a throwaway
PostgreSQL 15 cluster: the mitigation's SQL runs against both dialects' queueing code paths.

The in-process ORM (``airflow.settings.Session``) is pointed at the database under test, because
the triggerer-side listener writes through that thread-scoped session, exactly as in the
triggerer where ``Trigger.submit_event`` opened it.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.postgres import PostgresServer, postgres_server

pytestmark = pytest.mark.integration


@pytest.fixture(scope="session")
def postgres() -> Iterator[PostgresServer]:
    with postgres_server() as server:
        yield server


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
        timeout=300,
        check=False,
    )
    if result.returncode != 0:
        raise RuntimeError(f"airflow db migrate failed:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}")


@pytest.fixture(scope="session", params=["sqlite", "postgresql"])
def metadata_db_url(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> str:
    home = tmp_path_factory.mktemp(f"airflow-{request.param}")
    if request.param == "sqlite":
        url = f"sqlite:///{home / 'airflow.db'}"
    else:
        url = request.getfixturevalue("postgres").create_database("scheduling")
    _migrate(url, home)
    return url


@pytest.fixture
def metadata_db(metadata_db_url: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """Point Airflow's ORM at the migrated database for one test; empty the tables it touched."""
    from airflow import settings
    from airflow.configuration import conf

    monkeypatch.setenv("AIRFLOW__DATABASE__SQL_ALCHEMY_CONN", metadata_db_url)
    previous = conf.get("database", "sql_alchemy_conn")
    conf.set("database", "sql_alchemy_conn", metadata_db_url)
    settings.SQL_ALCHEMY_CONN = metadata_db_url
    settings.configure_orm()
    try:
        yield metadata_db_url
    finally:
        from sqlalchemy import text

        with settings.engine.begin() as conn:  # type: ignore[union-attr]
            for table in (
                "dagrun_asset_event",
                "asset_dag_run_queue",
                "asset_event",
                "task_instance",
                "dag_run",
                "serialized_dag",
                "dag_code",
                "dag_version",
                "dag_schedule_asset_reference",
                "asset_active",
                "asset",
                "dag",
                "dag_bundle",
            ):
                conn.execute(text(f"DELETE FROM {table}"))
        settings.dispose_orm()
        conf.set("database", "sql_alchemy_conn", previous)
        settings.SQL_ALCHEMY_CONN = previous
