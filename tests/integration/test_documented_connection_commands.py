"""
Every ``airflow connections add`` command the docs and the README show runs cleanly as written.

Run in the suite's environment, which has this provider's extras and not the official Amazon or
Kafka providers: the deployment ``docs/installation.rst`` says is enough. There the CLI does not
know the types ``aws`` and ``kafka``: ``--conn-type aws`` warns and stores a ``generic``
connection, which is why the docs use ``--conn-json``. Each command must print no warning and
store the connection with the type it names.
"""

from __future__ import annotations

import importlib.util
import json
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.airflow import migrated_airflow_home

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

ROOT = Path(__file__).resolve().parents[2]
TEXTS = [*sorted((ROOT / "docs").glob("*.rst")), ROOT / "README.md"]
COMMAND = re.compile(r"^[ \t]*(airflow connections add (?:[^\n]*\\\n)*[^\n]*)$", re.MULTILINE)


def documented_commands() -> list[tuple[str, str]]:
    found = []
    for path in TEXTS:
        for command in COMMAND.findall(path.read_text()):
            found.append((path.name, " ".join(command.replace("\\\n", " ").split())))
    return found


def test_the_docs_show_connection_commands() -> None:
    assert {where for where, _ in documented_commands()} >= {"quickstart.rst", "README.md", "connections.rst"}


def test_the_suite_runs_them_without_the_official_broker_providers() -> None:
    """Else the warning this guards against could not show."""
    assert importlib.util.find_spec("airflow.providers.amazon") is None
    assert importlib.util.find_spec("airflow.providers.apache.kafka") is None


def test_every_documented_connection_command_runs_without_a_warning(tmp_path: Path) -> None:
    dag = tmp_path / "empty_dag.py"
    dag.write_text("")
    (tmp_path / "home").mkdir()
    env = {**migrated_airflow_home(tmp_path / "home", dag), "SPARK_JWS": "documented-placeholder"}
    airflow = [sys.executable, "-m", "airflow"]
    commands: dict[str, list[str]] = {}  # one run per distinct command: the README repeats the quickstart's
    for where, command in documented_commands():
        commands.setdefault(command, []).append(where)
    expected: dict[str, str] = {}
    for command, where in commands.items():
        argv = shlex.split(command.replace("$SPARK_JWS", env["SPARK_JWS"]))
        ran = subprocess.run(airflow + argv[1:], env=env, capture_output=True, text=True, timeout=180)
        output = ran.stdout + ran.stderr
        assert ran.returncode == 0, f"{where}: {command}\n{output[-3000:]}"
        assert "warning" not in output.lower(), f"{where}: {command}\n{output[-3000:]}"
        assert "--conn-json" in argv, f"{where}: {command} (only --conn-json names a type without a warning)"
        assert argv[3] not in expected, f"two documented commands add {argv[3]}: give one another id"
        expected[argv[3]] = json.loads(argv[argv.index("--conn-json") + 1])["conn_type"]
    listed = subprocess.run(
        [*airflow, "connections", "list", "-o", "json"], env=env, capture_output=True, text=True
    )
    stored = {
        row["conn_id"]: row["conn_type"] for row in json.loads(listed.stdout[listed.stdout.index("[") :])
    }
    assert stored == expected
