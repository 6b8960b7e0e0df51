"""
A real Spark standalone cluster (master + one worker) from the pip ``pyspark`` package.

Used by the Spark integration tests and the end-to-end suite. The master's REST submission
server is enabled and protected by Spark's ``JWSFilter`` with a random secret, exactly as a
production master should be (the REST API runs arbitrary code). Every port is picked at run
time; both JVMs are stopped by PID when the block ends.

Typical use (pytest fixtures wrap this in tests/integration/spark/conftest.py)::

    with spark_standalone_cluster(tmp_path) as cluster:
        cluster.connection_uri()  # an AIRFLOW_CONN_* value for the deferrable operator
"""

from __future__ import annotations

import base64
import contextlib
import importlib.util
import json
import os
import secrets
import shutil
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import jwt

from tests.support.processes import free_port, running, tail, wait_for_port

SPARK_VERSION = "4.3.0"
VENV_BIN = Path(sys.executable).parent
DRIVER_PYTHON_LAUNCHER = VENV_BIN / "airflow-shared-stream-driver-python"
"""The provider's parent-death launcher (console script), for ``spark.pyspark.driver.python``."""


def spark_bin(name: str) -> Path:
    """Path of a script of the full pyspark package (``spark-class``, ``spark-submit``); fail loudly."""
    path = VENV_BIN / name
    if not path.exists():
        found = shutil.which(name)
        if found is None:
            raise RuntimeError(
                f"{name} not found: the full pyspark=={SPARK_VERSION} (not pyspark-client) must be "
                "installed; run scripts/bootstrap.sh"
            )
        path = Path(found)
    return path


@dataclass(frozen=True)
class SparkCluster:
    """Addresses and credentials of a running standalone cluster."""

    master_port: int
    rest_port: int
    master_ui_port: int
    secret_key: str
    """Base64url HS256 key of the master's JWSFilter (never given to the operator)."""
    token: str
    """A JWS signed with ``secret_key``: what a client sends as ``Authorization: Bearer``."""
    work_dir: Path
    log_dir: Path

    @property
    def master_url(self) -> str:
        return f"spark://127.0.0.1:{self.master_port}"

    @property
    def rest_url(self) -> str:
        return f"http://127.0.0.1:{self.rest_port}"

    def connection(self, **extra: object) -> dict[str, object]:
        """An Airflow Connection (JSON form) for the deferrable operator: cluster mode over REST."""
        return {
            "conn_type": "spark",
            "host": "spark://127.0.0.1",
            "port": self.master_port,
            "password": self.token,
            "extra": {
                "deploy-mode": "cluster",
                "rest-port": self.rest_port,
                "rest-scheme": "http",
                "pyspark-driver-python": str(DRIVER_PYTHON_LAUNCHER),
                "pyspark-python": sys.executable,
                **extra,
            },
        }

    def connection_json(self, **extra: object) -> str:
        """The value of an ``AIRFLOW_CONN_<ID>`` environment variable for :meth:`connection`."""
        return json.dumps(self.connection(**extra))

    def master_state(self) -> dict:
        """The master UI's JSON view (workers, active and completed drivers)."""
        with urllib.request.urlopen(f"http://127.0.0.1:{self.master_ui_port}/json/", timeout=5) as resp:
            return json.loads(resp.read())

    def driver_dirs(self) -> list[Path]:
        """Working directories the worker created for drivers (``driver-*``), newest last."""
        return sorted(self.work_dir.glob("driver-*"), key=lambda p: p.stat().st_mtime)

    def driver_log(self, driver_id: str) -> str:
        """stdout + stderr of a driver, for assertion messages."""
        out = []
        for name in ("stdout", "stderr"):
            path = self.work_dir / driver_id / name
            with contextlib.suppress(OSError):
                out.append(f"--- {name}\n{path.read_text(errors='replace')[-4000:]}")
        return "\n".join(out)


def make_secret_key() -> str:
    """A random 256-bit HS256 key, base64url-encoded as JWSFilter's ``secretKey`` wants it."""
    return base64.urlsafe_b64encode(secrets.token_bytes(32)).decode().rstrip("=")


def make_token(secret_key: str, ttl_seconds: int = 3600) -> str:
    """A JWS (HS256) the JWSFilter accepts for ``secret_key``."""
    key = base64.urlsafe_b64decode(secret_key + "=" * (-len(secret_key) % 4))
    now = int(time.time())
    return jwt.encode({"sub": "airflow", "iat": now, "exp": now + ttl_seconds}, key, algorithm="HS256")


def _spark_env(work_dir: Path) -> dict[str, str]:
    env = {
        **spark_client_env(),
        "SPARK_LOCAL_IP": "127.0.0.1",
        "SPARK_LOCAL_DIRS": str(work_dir / "local"),
        "SPARK_LOG_DIR": str(work_dir / "logs"),
        "SPARK_NO_DAEMONIZE": "1",
    }
    return env


@contextlib.contextmanager
def spark_standalone_cluster(
    base_dir: Path,
    *,
    worker_cores: int = 2,
    worker_memory: str = "4g",
    start_timeout: float = 90.0,
    retained_drivers: int = 1000,
) -> Iterator[SparkCluster]:
    """
    Start a master (REST on, JWS-protected) and one worker on free ports; stop both on exit.

    ``retained_drivers`` is the master's ``spark.deploy.retainedDrivers``: how many completed
    drivers it keeps answering for (the default keeps them for the whole session).

    Raises ``RuntimeError`` with the JVM's log tail if either does not come up: a cluster that
    cannot start fails the test, it never skips it.
    """
    base_dir.mkdir(parents=True, exist_ok=True)
    work_dir = base_dir / "work"
    log_dir = base_dir / "logs"
    for d in (work_dir, log_dir, base_dir / "local"):
        d.mkdir(parents=True, exist_ok=True)
    secret_key = make_secret_key()
    master_port, rest_port, master_ui_port = free_port(), free_port(), free_port()
    worker_port, worker_ui_port = free_port(), free_port()

    props = base_dir / "master.properties"
    props.write_text(
        "\n".join(
            [
                "spark.master.rest.enabled=true",
                "spark.master.rest.host=127.0.0.1",
                f"spark.master.rest.port={rest_port}",
                "spark.master.rest.filters=org.apache.spark.ui.JWSFilter",
                f"spark.org.apache.spark.ui.JWSFilter.param.secretKey={secret_key}",
                f"spark.deploy.retainedDrivers={retained_drivers}",
                "",
            ]
        )
    )
    os.chmod(props, 0o600)
    env = _spark_env(base_dir)
    spark_class = str(spark_bin("spark-class"))
    master_argv = [
        spark_class,
        "org.apache.spark.deploy.master.Master",
        "--host",
        "127.0.0.1",
        "--port",
        str(master_port),
        "--webui-port",
        str(master_ui_port),
        "--properties-file",
        str(props),
    ]
    master_log = log_dir / "master.log"
    with running(master_argv, log_path=master_log, env=env, cwd=base_dir) as master:
        try:
            wait_for_port(master_port, start_timeout, master, "Spark master")
            wait_for_port(rest_port, start_timeout, master, "Spark master REST server")
        except RuntimeError as exc:
            raise RuntimeError(f"{exc}\n{tail(master_log)}") from None
        worker_argv = [
            spark_class,
            "org.apache.spark.deploy.worker.Worker",
            "--host",
            "127.0.0.1",
            "--port",
            str(worker_port),
            "--webui-port",
            str(worker_ui_port),
            "--cores",
            str(worker_cores),
            "--memory",
            worker_memory,
            "--work-dir",
            str(work_dir),
            f"spark://127.0.0.1:{master_port}",
        ]
        worker_log = log_dir / "worker.log"
        with running(worker_argv, log_path=worker_log, env=env, cwd=base_dir) as worker:
            cluster = SparkCluster(
                master_port=master_port,
                rest_port=rest_port,
                master_ui_port=master_ui_port,
                secret_key=secret_key,
                token=make_token(secret_key, ttl_seconds=24 * 3600),
                work_dir=work_dir,
                log_dir=log_dir,
            )
            deadline = time.monotonic() + start_timeout
            while True:
                if worker.poll() is not None:
                    raise RuntimeError(f"Spark worker exited with {worker.returncode}\n{tail(worker_log)}")
                with contextlib.suppress(OSError, ValueError):
                    if any(w.get("state") == "ALIVE" for w in cluster.master_state().get("workers", [])):
                        break
                if time.monotonic() > deadline:
                    raise RuntimeError(
                        f"Spark worker did not register within {start_timeout}s\n"
                        f"{tail(worker_log)}\n{tail(master_log)}"
                    )
                time.sleep(0.2)
            yield cluster


def spark_home() -> Path:
    """SPARK_HOME of the installed full pyspark (its jars and bin/)."""
    spec = importlib.util.find_spec("pyspark")
    if spec is None or spec.origin is None:
        raise RuntimeError(f"pyspark=={SPARK_VERSION} is not installed; run scripts/bootstrap.sh")
    home = Path(spec.origin).parent
    if not (home / "jars").is_dir():
        raise RuntimeError(f"{home} has no jars/: pyspark-client is installed instead of pyspark")
    return home


def spark_client_env() -> dict[str, str]:
    """Environment under which ``spark-submit`` (SparkSubmitHook) finds this Spark and Python."""
    return {
        "SPARK_HOME": str(spark_home()),
        "PATH": f"{VENV_BIN}{os.pathsep}{os.environ.get('PATH', '')}",
        "PYSPARK_PYTHON": sys.executable,
    }


def pid_alive(pid: int) -> bool:
    """True while ``pid`` runs (a zombie answers ``kill(0)`` but has exited)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    stat = Path(f"/proc/{pid}/stat")
    return stat.exists() and stat.read_text().split(") ", 1)[1][0] != "Z"


class MemoryTaskStateStore:
    """In-process stand-in for Airflow 3.3's ``task_state_store`` (``get``/``set``/``delete``)."""

    def __init__(self) -> None:
        self.values: dict[str, object] = {}

    def get(self, key: str, default: object = None) -> object:
        return self.values.get(key, default)

    def set(self, key: str, value: object, **_: object) -> None:
        self.values[key] = value

    def delete(self, key: str) -> None:
        self.values.pop(key, None)


def spark_submit_local(app: Path, *args: str, timeout: float = 300.0) -> subprocess.CompletedProcess:
    """Run ``app`` with ``spark-submit --master local[2]`` (for checking a job without a cluster)."""
    return subprocess.run(
        [
            str(spark_bin("spark-submit")),
            "--master",
            "local[2]",
            "--conf",
            "spark.ui.enabled=false",
            str(app),
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **spark_client_env(), "PYSPARK_DRIVER_PYTHON": sys.executable},
        check=False,
    )
