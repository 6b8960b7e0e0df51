"""
A throwaway PostgreSQL 15 cluster for tests and the demo (TEST_RIG.md, "PostgreSQL").

``initdb`` refuses to run as root, so when the tests run as root the server runs as the
``postgres`` user, in a directory that user can reach (a fresh one under ``/tmp``, not the
pytest temp dir under root's 0700 home). It listens on a free loopback port and is stopped with
``pg_ctl stop -m fast`` (by its data directory, i.e. by the postmaster's PID file).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from tests.support.processes import free_port

PG_BIN = Path(os.environ.get("SHARED_STREAM_PG_BIN", "/usr/lib/postgresql/15/bin"))
SERVER_USER = "postgres"
DB_USER = "airflow"


@dataclass(frozen=True)
class PostgresServer:
    root: Path
    port: int

    def url(self, database: str = "airflow", driver: str = "psycopg2") -> str:
        """The SQLAlchemy URL of ``database`` (Airflow's ``[database] sql_alchemy_conn``)."""
        return f"postgresql+{driver}://{DB_USER}@127.0.0.1:{self.port}/{database}"

    def create_database(self, name: str) -> str:
        """Create a fresh database; return its SQLAlchemy URL."""
        import psycopg2

        conn = psycopg2.connect(host="127.0.0.1", port=self.port, user=DB_USER, dbname="postgres")
        try:
            conn.autocommit = True
            with conn.cursor() as cur:
                cur.execute(f'CREATE DATABASE "{name}"')
        finally:
            conn.close()
        return self.url(name)


def _as_server_user(argv: list[str]) -> list[str]:
    return argv if os.geteuid() != 0 else ["runuser", "-u", SERVER_USER, "--", *argv]


def _run(argv: list[str], what: str) -> None:
    result = subprocess.run(_as_server_user(argv), capture_output=True, text=True, check=False, timeout=120)
    if result.returncode != 0:
        output = f"{result.stdout[-2000:]}\n{result.stderr[-2000:]}"
        raise RuntimeError(f"{what} failed ({result.returncode}):\n{output}")


@contextlib.contextmanager
def postgres_server() -> Iterator[PostgresServer]:
    """Start a fresh cluster for the block (about 1.5 s) and stop it afterwards, also on failure."""
    if not (PG_BIN / "initdb").exists():
        raise RuntimeError(f"PostgreSQL server binaries not found in {PG_BIN} (Debian package postgresql-15)")
    root = Path(tempfile.mkdtemp(prefix="shared-stream-pg-", dir="/tmp"))
    if os.geteuid() == 0:
        shutil.chown(root, user=SERVER_USER)
    data, port = root / "data", free_port()
    try:
        _run([str(PG_BIN / "initdb"), "-D", str(data), "-A", "trust", "-U", DB_USER], "initdb")
        _run(
            [
                str(PG_BIN / "pg_ctl"),
                "-D",
                str(data),
                "-o",
                f"-h 127.0.0.1 -p {port} -k {root} -c max_connections=200",
                "-l",
                str(root / "server.log"),
                "-w",
                "start",
            ],
            "pg_ctl start",
        )
        try:
            server = PostgresServer(root=root, port=port)
            server.create_database("airflow")
            yield server
        finally:
            _run([str(PG_BIN / "pg_ctl"), "-D", str(data), "-m", "fast", "-w", "stop"], "pg_ctl stop")
    finally:
        shutil.rmtree(root, ignore_errors=True)
