"""
Run a real Airflow 3.3 deployment (dag-processor, scheduler, triggerer, api-server) for tests.

Everything lives in a temporary ``AIRFLOW_HOME``; the metadata database is SQLite in that home
(the default) or any SQLAlchemy URL, e.g. a throwaway PostgreSQL cluster from
``tests/support/postgres.py`` (``database_url=``). Every port is picked at run time; every
process is stopped by PID (its process group) when the deployment stops. The e2e suite and the
demo use the same class, so what the demo shows is what the tests assert.

Reading state goes straight to the metadata database (read-only SQLite connections, or one
psycopg2 connection per read on PostgreSQL): it is what the scheduler itself sees, it needs no
API token, and it is cheap to poll.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import httpx
from cryptography.fernet import Fernet

from tests.support.migrated_databases import copy_migrated, keep_as_template
from tests.support.processes import free_port, stop_all, tail, wait_for_port, wait_until

COMPONENTS = ("dag-processor", "scheduler", "triggerer", "api-server")
"""Started in this order: Dags parse while the rest boots; the api-server is slowest (~35 s)."""


@dataclass(frozen=True, slots=True)
class DagRunRow:
    dag_id: str
    run_id: str
    state: str | None
    run_type: str
    created_at: datetime | None
    queued_at: datetime | None
    start_date: datetime | None
    end_date: datetime | None
    asset_event_ids: tuple[int, ...]
    run_after: datetime | None = None
    """For an asset-triggered run, the close of its event window (its newest queue row's time)."""


@dataclass(frozen=True, slots=True)
class AssetEventRow:
    id: int
    asset_name: str
    asset_uri: str
    timestamp: datetime
    extra: dict[str, Any]

    @property
    def payload(self) -> Any:
        """The trigger event payload (``extra["payload"]``) of an event a watcher created."""
        return self.extra.get("payload")


@dataclass(frozen=True, slots=True)
class TaskInstanceRow:
    dag_id: str
    run_id: str
    task_id: str
    state: str | None
    try_number: int
    start_date: datetime | None
    end_date: datetime | None
    operator: str | None


def _ts(value: str | datetime | None) -> datetime | None:
    """SQLite stores Airflow's UTC timestamps as naive ISO strings; PostgreSQL returns datetimes."""
    if value is None:
        return None
    parsed = value if isinstance(value, datetime) else datetime.fromisoformat(value)
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=timezone.utc)


def airflow_bin() -> Path:
    """The ``airflow`` entry point of the running interpreter's environment."""
    return Path(sys.executable).parent / "airflow"


REPO = Path(__file__).resolve().parents[2]
SQLITE_BUSY_TIMEOUT = 60.0
"""
Seconds a component waits for SQLite's write lock before "database is locked" (sqlite3's own
default is 5 s). On a loaded machine an api-server request held the lock for 6 s and the
triggerer's supervisor, whose insert of an asset event timed out, exited (Airflow does not
retry it): the demo's busy run of 2026-11-29. PostgreSQL has no such limit.
"""


def migrated_airflow_home(home: Path, dag_file: Path) -> dict[str, str]:
    """
    A migrated Airflow home on SQLite whose Dags folder holds ``dag_file`` alone: the environment
    for Airflow CLI runs in processes of their own (``airflow dags test``, a Dag file run as a script).
    """
    (home / "dags").mkdir()
    shutil.copy(dag_file, home / "dags" / dag_file.name)
    env = {
        **os.environ,
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{home}/airflow.db",
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__CORE__DAGS_FOLDER": str(home / "dags"),
        "PYTHONPATH": str(REPO),
    }
    migrate = subprocess.run(
        [sys.executable, "-m", "airflow", "db", "migrate"],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert migrate.returncode == 0, migrate.stdout[-3000:] + migrate.stderr[-3000:]
    return env


@dataclass
class AirflowDeployment:
    """
    One Airflow deployment in ``home``, serving the Dags in ``dags_folder``.

    :param env: extra environment for every component: ``AIRFLOW_CONN_*`` connections,
        settings the Dags read, ``AIRFLOW__SECTION__KEY`` overrides.
    :param parallelism: ``[core] parallelism``; low on 2-core machines so Spark keeps its CPU.
    :param database_url: the metadata database (``[database] sql_alchemy_conn``); ``None`` is
        SQLite in ``home``. ``postgresql+psycopg2://...`` URLs are read with psycopg2.
    """

    home: Path
    dags_folder: Path
    env: Mapping[str, str] = field(default_factory=dict)
    parallelism: int = 4
    database_url: str | None = None
    api_port: int = field(default_factory=free_port)
    procs: dict[str, subprocess.Popen] = field(default_factory=dict, init=False)
    _environment: dict[str, str] | None = field(default=None, init=False, repr=False)

    @property
    def db_path(self) -> Path:
        return self.home / "airflow.db"

    @property
    def sql_alchemy_conn(self) -> str:
        return self.database_url or f"sqlite:///{self.db_path}?timeout={SQLITE_BUSY_TIMEOUT:g}"

    @property
    def database(self) -> str:
        """``sqlite`` or ``postgresql``: for logs, result tables and the demo's summary."""
        return self.sql_alchemy_conn.split(":", 1)[0].split("+", 1)[0]

    @property
    def api_url(self) -> str:
        return f"http://127.0.0.1:{self.api_port}"

    def log_path(self, component: str) -> Path:
        return self.home / "process-logs" / f"{component}.log"

    def environment(self) -> dict[str, str]:
        """The full environment of every component (and of CLI calls against this deployment)."""
        venv_bin = str(Path(sys.executable).parent)
        base = {k: v for k, v in os.environ.items() if not k.startswith("AIRFLOW")}
        return {
            **base,
            "PATH": f"{venv_bin}{os.pathsep}{base.get('PATH', '')}",
            "AIRFLOW_HOME": str(self.home),
            "AIRFLOW__CORE__DAGS_FOLDER": str(self.dags_folder),
            "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
            "AIRFLOW__CORE__EXECUTOR": "LocalExecutor",
            "AIRFLOW__CORE__PARALLELISM": str(self.parallelism),
            # Watchers only start for active Dags: born unpaused, nothing to click.
            "AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION": "False",
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS": "True",
            "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"{self.api_url}/execution/",
            "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": self.sql_alchemy_conn,
            "AIRFLOW__API__HOST": "127.0.0.1",
            "AIRFLOW__API__PORT": str(self.api_port),
            "AIRFLOW__API__BASE_URL": self.api_url,
            # Scheduler and api-server must agree on the JWT key; a random one per deployment.
            "AIRFLOW__API_AUTH__JWT_SECRET": secrets.token_urlsafe(32),
            # And every component on the Fernet key (trigger arguments and connections are
            # encrypted with it) and the api-server's secret key. Without them each component
            # that finds no airflow.cfg generates its own and races to write the file: a copied
            # database (tests/support/migrated_databases.py) has no migration CLI run first to
            # write it, and the triggerer could not decrypt the triggers the dag-processor wrote.
            "AIRFLOW__CORE__FERNET_KEY": Fernet.generate_key().decode(),
            "AIRFLOW__API__SECRET_KEY": secrets.token_urlsafe(32),
            "AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL": "5",
            "AIRFLOW__DAG_PROCESSOR__PARSING_PROCESSES": "1",
            "AIRFLOW__SCHEDULER__SCHEDULER_IDLE_SLEEP_TIME": "0.5",
            "AIRFLOW__LOGGING__LOGGING_LEVEL": "INFO",
            # A SIGKILLed triggerer's watchers move to its successor after this long.
            "AIRFLOW__TRIGGERER__TRIGGERER_HEALTH_CHECK_THRESHOLD": "15",
            **self.env,
        }

    def _env(self) -> dict[str, str]:
        # Computed once: the JWT secret must be the same for every component.
        if self._environment is None:
            self._environment = self.environment()
        return self._environment

    # ----------------------------------------------------------------- lifecycle

    def cli(self, *args: str, timeout: float = 120.0) -> subprocess.CompletedProcess[str]:
        """Run ``airflow <args>`` against this deployment; raise with its output on failure."""
        result = subprocess.run(
            [str(airflow_bin()), *args],
            env=self._env(),
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        if result.returncode != 0:
            raise RuntimeError(
                f"airflow {' '.join(args)} exited {result.returncode}:\n{result.stdout[-3000:]}\n"
                f"{result.stderr[-3000:]}"
            )
        return result

    def trigger_dag(self, dag_id: str) -> str:
        """
        A manual run of ``dag_id`` through the REST API (``[core] simple_auth_manager_all_admins``):
        what ``airflow dags trigger`` does, without starting a CLI process. Returns its run id.
        """
        import httpx

        answer = httpx.post(
            f"{self.api_url}/api/v2/dags/{dag_id}/dagRuns", json={"logical_date": None}, timeout=60
        )
        if answer.status_code != 200:
            raise RuntimeError(f"triggering {dag_id} answered {answer.status_code}: {answer.text[:2000]}")
        return str(answer.json()["dag_run_id"])

    def migrate(self) -> None:
        """Migrate the empty metadata database, or copy the session's first migrated one."""
        self.home.mkdir(parents=True, exist_ok=True)
        if copy_migrated(self.database_url, self.db_path):
            return
        self.cli("db", "migrate", timeout=300)
        keep_as_template(self.database_url, self.db_path)

    def start_component(self, component: str, *args: str, name: str | None = None) -> subprocess.Popen:
        """
        Start one component in its own process group (so a kill takes its children too).

        ``args`` go to its command line (``"--capacity", "6"``); ``name`` keys it in
        :attr:`procs` and names its log (default: the component), so a deployment can run two
        triggerers.
        """
        name = name or component
        if name in self.procs and self.procs[name].poll() is None:
            raise RuntimeError(f"{name} is already running (pid {self.procs[name].pid})")
        log_path = self.log_path(name)
        log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(log_path, "ab") as log_file:
            log_file.write(f"\n==== start {component} at {datetime.now(timezone.utc)} ====\n".encode())
            log_file.flush()
            proc = subprocess.Popen(
                [str(airflow_bin()), *component.split(), *args],
                stdout=log_file,
                stderr=subprocess.STDOUT,
                env=self._env(),
                cwd=self.home,
                start_new_session=True,
            )
        self.procs[name] = proc
        return proc

    def start(self, api_timeout: float = 120.0) -> None:
        """Migrate the database, start every component and wait for the api-server to listen."""
        self.migrate()
        for component in COMPONENTS:
            self.start_component(component)
        wait_for_port(self.api_port, api_timeout, self.procs["api-server"], "airflow api-server")
        self.warm_up_execution_api()
        self.check_alive()

    def warm_up_execution_api(self, timeout: float = 300.0) -> None:
        """
        Have the api-server build its Execution API before any test times a request.

        Airflow builds the Execution API's versioned routes (Cadwyn) on the first request to
        ``/execution``, synchronously on the api-server's only event loop: every request waits
        until it is done, tens of seconds on a loaded machine (docs/console.rst, "The api-server's
        first Execution API request"). Without this the first task's start would take that pause.
        """
        answer = httpx.get(f"{self.api_url}/execution/health", timeout=timeout)
        answer.raise_for_status()

    def check_alive(self) -> None:
        """Fail with the component's log tail if any component died."""
        for component, proc in self.procs.items():
            if proc.poll() is not None:
                raise RuntimeError(
                    f"airflow {component} exited with {proc.returncode}:\n{tail(self.log_path(component))}"
                )

    def stop(self) -> None:
        """Stop every component at once (each gets the same grace period to shut down)."""
        stop_all(list(reversed(self.procs.values())))

    def kill_triggerer(self, name: str = "triggerer") -> int:
        """SIGKILL the triggerer ``name`` and its trigger-runner child: no goodbye, no cleanup."""
        proc = self.procs[name]
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)
        return proc.pid

    def restart_triggerer(self) -> subprocess.Popen:
        return self.start_component("triggerer")

    # ----------------------------------------------------------------- metadata DB

    @contextlib.contextmanager
    def db(self) -> Iterator[_Reader]:
        """A read-only connection to the metadata database, closed after the block."""
        if self.database == "postgresql":
            import psycopg2
            import psycopg2.extras

            url = self.sql_alchemy_conn.replace("postgresql+psycopg2://", "postgresql://", 1)
            pg = psycopg2.connect(url, cursor_factory=psycopg2.extras.RealDictCursor)
            pg.set_session(readonly=True, autocommit=True)
            try:
                yield _Reader(pg, placeholder="%s")
            finally:
                pg.close()
            return
        conn = sqlite3.connect(f"file:{self.db_path}?mode=ro", uri=True, timeout=30)
        conn.row_factory = sqlite3.Row
        try:
            yield _Reader(conn, placeholder="?")
        finally:
            conn.close()

    def import_errors(self) -> list[tuple[str, str]]:
        with self.db() as conn:
            rows = conn.execute("SELECT filename, stacktrace FROM import_error ORDER BY filename").fetchall()
        return [(r["filename"], r["stacktrace"]) for r in rows]

    def parsed_dag_ids(self) -> set[str]:
        with self.db() as conn:
            rows = conn.execute("SELECT dag_id FROM dag WHERE NOT is_stale").fetchall()
        return {r["dag_id"] for r in rows}

    def wait_for_dags(self, dag_ids: set[str], timeout: float = 180.0) -> None:
        """Wait until every Dag in ``dag_ids`` is parsed (or fail, with the import errors)."""

        def parsed() -> bool:
            self.check_alive()
            return dag_ids <= self.parsed_dag_ids()

        try:
            wait_until(parsed, timeout, f"Dags {sorted(dag_ids)} to be parsed", interval=0.5)
        except RuntimeError as exc:
            raise RuntimeError(
                f"{exc}; parsed: {sorted(self.parsed_dag_ids())}; import errors: {self.import_errors()}\n"
                f"dag-processor log:\n{tail(self.log_path('dag-processor'))}"
            ) from None

    def watcher_trigger_ids(self) -> dict[str, int]:
        """Watcher name -> trigger id of every registered AssetWatcher."""
        with self.db() as conn:
            rows = conn.execute("SELECT name, trigger_id FROM asset_watcher").fetchall()
        return {r["name"]: r["trigger_id"] for r in rows}

    def assigned_trigger_ids(self) -> set[int]:
        """Triggers a live triggerer has picked up."""
        with self.db() as conn:
            rows = conn.execute("SELECT id FROM trigger WHERE triggerer_id IS NOT NULL").fetchall()
        return {r["id"] for r in rows}

    def wait_for_watchers(self, names: set[str], timeout: float = 120.0) -> None:
        """Wait until the triggerer runs every watcher in ``names``."""

        def running() -> bool:
            self.check_alive()
            ids = self.watcher_trigger_ids()
            return names <= ids.keys() and {ids[n] for n in names} <= self.assigned_trigger_ids()

        try:
            wait_until(running, timeout, f"watchers {sorted(names)} to run in the triggerer", interval=0.5)
        except RuntimeError as exc:
            raise RuntimeError(f"{exc}\ntriggerer log:\n{tail(self.log_path('triggerer'))}") from None

    def asset_events(self, asset_name: str | None = None) -> list[AssetEventRow]:
        query = (
            "SELECT e.id, a.name, a.uri, e.timestamp, e.extra FROM asset_event e "
            "JOIN asset a ON a.id = e.asset_id"
        )
        params: tuple[Any, ...] = ()
        if asset_name is not None:
            query += " WHERE a.name = ?"
            params = (asset_name,)
        with self.db() as conn:
            rows = conn.execute(query + " ORDER BY e.id", params).fetchall()
        return [
            AssetEventRow(
                id=r["id"],
                asset_name=r["name"],
                asset_uri=r["uri"],
                timestamp=_ts(r["timestamp"]),  # type: ignore[arg-type]
                extra=json.loads(r["extra"]) if isinstance(r["extra"], str) else r["extra"],
            )
            for r in rows
        ]

    def dag_runs(self, dag_id: str) -> list[DagRunRow]:
        with self.db() as conn:
            runs = conn.execute(
                "SELECT id, dag_id, run_id, state, run_type, created_at, queued_at, start_date, end_date, "
                "run_after FROM dag_run WHERE dag_id = ? ORDER BY id",
                (dag_id,),
            ).fetchall()
            links = conn.execute(
                "SELECT l.dag_run_id, l.event_id FROM dagrun_asset_event l "
                "JOIN dag_run r ON r.id = l.dag_run_id WHERE r.dag_id = ?",
                (dag_id,),
            ).fetchall()
        events: dict[int, list[int]] = {}
        for link in links:
            events.setdefault(link["dag_run_id"], []).append(link["event_id"])
        return [
            DagRunRow(
                dag_id=r["dag_id"],
                run_id=r["run_id"],
                state=r["state"],
                run_type=r["run_type"],
                created_at=_ts(r["created_at"]),
                queued_at=_ts(r["queued_at"]),
                start_date=_ts(r["start_date"]),
                end_date=_ts(r["end_date"]),
                asset_event_ids=tuple(sorted(events.get(r["id"], []))),
                run_after=_ts(r["run_after"]),
            )
            for r in runs
        ]

    def max_active_runs(self, dag_id: str) -> int:
        with self.db() as conn:
            row = conn.execute("SELECT max_active_runs FROM dag WHERE dag_id = ?", (dag_id,)).fetchone()
        return int(row["max_active_runs"]) if row and row["max_active_runs"] is not None else 16

    def queued_assets(self, dag_id: str) -> int:
        """Rows of the asset-triggered run queue (ADRQ) for ``dag_id``: a run is about to be created."""
        with self.db() as conn:
            row = conn.execute(
                "SELECT count(*) AS n FROM asset_dag_run_queue WHERE target_dag_id = ?", (dag_id,)
            ).fetchone()
        return int(row["n"])

    def task_instances(self, dag_id: str) -> list[TaskInstanceRow]:
        with self.db() as conn:
            rows = conn.execute(
                "SELECT dag_id, run_id, task_id, state, try_number, start_date, end_date, operator "
                "FROM task_instance WHERE dag_id = ? ORDER BY start_date",
                (dag_id,),
            ).fetchall()
        return [
            TaskInstanceRow(
                dag_id=r["dag_id"],
                run_id=r["run_id"],
                task_id=r["task_id"],
                state=r["state"],
                try_number=r["try_number"],
                start_date=_ts(r["start_date"]),
                end_date=_ts(r["end_date"]),
                operator=r["operator"],
            )
            for r in rows
        ]

    def task_log(self, dag_id: str, run_id: str, task_id: str) -> str:
        """Concatenated task log files of one task instance (every try), for failure messages."""
        root = self.home / "logs" / f"dag_id={dag_id}" / f"run_id={run_id}" / f"task_id={task_id}"
        return "\n".join(p.read_text(errors="replace") for p in sorted(root.rglob("*.log")))


class _Reader:
    """``execute(sql, params).fetchall()`` over SQLite or psycopg2; queries are written with ``?``."""

    def __init__(self, conn: Any, placeholder: str) -> None:
        self._conn = conn
        self._placeholder = placeholder

    def execute(self, sql: str, params: tuple[Any, ...] = ()) -> Any:
        if self._placeholder == "?":
            return self._conn.execute(sql, params)
        cursor = self._conn.cursor()
        cursor.execute(sql.replace("?", "%s"), params)
        return cursor


@contextlib.contextmanager
def airflow_deployment(
    home: Path,
    dags_folder: Path,
    env: Mapping[str, str] | None = None,
    *,
    parallelism: int = 4,
    database_url: str | None = None,
) -> Iterator[AirflowDeployment]:
    """Start a deployment for the block; stop every process it started, also on failure."""
    deployment = AirflowDeployment(
        home=home,
        dags_folder=dags_folder,
        env=dict(env or {}),
        parallelism=parallelism,
        database_url=database_url,
    )
    try:
        deployment.start()
        yield deployment
    finally:
        deployment.stop()


def wait_for(
    condition: Any, timeout: float, what: str, deployment: AirflowDeployment, interval: float = 0.5
) -> None:
    """``wait_until`` that also fails fast when an Airflow component died."""

    def check() -> bool:
        deployment.check_alive()
        return bool(condition())

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(interval)
    raise RuntimeError(f"timed out after {timeout}s waiting for {what}")
