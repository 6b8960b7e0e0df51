"""
Fresh Airflow metadata databases without running ``airflow db migrate`` for each deployment.

A test session starts several deployments, each on an empty database of its own, and each
migration is an Airflow CLI process (seconds of CPU on a 2-core machine). The first migration of
a session is kept as a template: on SQLite a copy of the file, on PostgreSQL a database of the
same server (``CREATE DATABASE ... TEMPLATE``). Every later deployment gets a copy of it, which
is what a migration would have written: the schema and Airflow's own rows, nothing of any test.
"""

from __future__ import annotations

import atexit
import shutil
import tempfile
from pathlib import Path

TEMPLATE_DATABASE = "airflow_migrated_template"
"""On each PostgreSQL server: a migrated, never used database that new ones are copied from."""

_sqlite_template: Path | None = None


def copy_migrated(database_url: str | None, sqlite_path: Path) -> bool:
    """Give this deployment's empty database a migrated copy; False when there is no template yet."""
    if database_url is None:
        if _sqlite_template is None or sqlite_path.exists():
            return False
        shutil.copyfile(_sqlite_template, sqlite_path)
        return True
    server, name = _postgres_server_and_database(database_url)
    if not _execute(server, "SELECT 1 FROM pg_database WHERE datname = %s", (TEMPLATE_DATABASE,)):
        return False
    _execute(server, f'DROP DATABASE "{name}"')
    _execute(server, f'CREATE DATABASE "{name}" TEMPLATE "{TEMPLATE_DATABASE}" STRATEGY FILE_COPY')
    return True


def keep_as_template(database_url: str | None, sqlite_path: Path) -> None:
    """Right after a migration (no connection open to the database): keep a copy for the next ones."""
    global _sqlite_template
    if database_url is None:
        if _sqlite_template is None:
            folder = tempfile.mkdtemp(prefix="airflow-migrated-")
            atexit.register(shutil.rmtree, folder, True)
            kept = Path(folder) / "airflow.db"
            shutil.copyfile(sqlite_path, kept)
            _sqlite_template = kept
        return
    server, name = _postgres_server_and_database(database_url)
    if not _execute(server, "SELECT 1 FROM pg_database WHERE datname = %s", (TEMPLATE_DATABASE,)):
        _execute(server, f'CREATE DATABASE "{TEMPLATE_DATABASE}" TEMPLATE "{name}"')


def _postgres_server_and_database(database_url: str) -> tuple[tuple[str, int], str]:
    from sqlalchemy.engine import make_url

    url = make_url(database_url)
    return (url.host or "127.0.0.1", url.port or 5432), str(url.database)


def _execute(server: tuple[str, int], statement: str, params: tuple[str, ...] = ()) -> list[tuple]:
    """One statement in autocommit (``CREATE DATABASE`` cannot run in a transaction); its rows."""
    import psycopg2

    from tests.support.postgres import DB_USER

    conn = psycopg2.connect(host=server[0], port=server[1], user=DB_USER, dbname="postgres")
    try:
        conn.autocommit = True
        with conn.cursor() as cur:
            cur.execute(statement, params or None)
            return list(cur.fetchall()) if cur.description else []
    finally:
        conn.close()
