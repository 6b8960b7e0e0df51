"""
The package refuses to load on an Airflow older than the one it needs, with a message that says so.

pip keeps the lower bound at install time, but an image can still end up with an older Airflow
(a constraints file, a later downgrade, ``--no-deps``). The triggers would then fail at their
first settlement on an ack channel without lanes; an error at import, naming both versions, is
what Airflow's own providers give instead.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import tomllib
from packaging.requirements import Requirement

import airflow_shared_stream
from airflow_shared_stream import MIN_AIRFLOW_VERSION, require_airflow

ROOT = Path(__file__).resolve().parents[2]


def _import_under_airflow(version: str) -> subprocess.CompletedProcess[str]:
    """
    Import the package in a fresh interpreter whose ``airflow`` module says ``version``.

    A stand-in module: importing the real Airflow loads its providers, this package among them,
    before a test could change the version it reports.
    """
    code = (
        "import sys, types\n"
        f"sys.modules['airflow'] = types.SimpleNamespace(__version__={version!r})\n"
        "import airflow_shared_stream\n"
    )
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=False)


def test_importing_the_package_on_an_older_airflow_raises_naming_both_versions() -> None:
    result = _import_under_airflow("3.3.1")

    assert result.returncode == 1
    assert "RuntimeError: The package `airflow-shared-stream:" in result.stderr
    assert "needs Apache Airflow 3.3.2+" in result.stderr
    assert "this is Airflow 3.3.1" in result.stderr


def test_importing_the_package_on_the_supported_airflow_succeeds() -> None:
    result = _import_under_airflow("3.3.2")

    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize("version", ["3.3.2", "3.3.2rc1", "3.3.2.dev0", "3.4.0", "4.0.0"])
def test_the_supported_airflow_and_later_load(version: str) -> None:
    require_airflow(version)


@pytest.mark.parametrize("version", ["3.3.1", "3.2.9", "2.11.0"])
def test_an_older_airflow_is_refused(version: str) -> None:
    with pytest.raises(RuntimeError, match=rf"needs Apache Airflow 3\.3\.2\+.*this is Airflow {version}"):
        require_airflow(version)


def test_without_airflow_installed_there_is_nothing_to_check() -> None:
    """The Spark driver launcher imports this package on Spark nodes; it must not need Airflow."""
    require_airflow(None)


def test_the_guard_reads_the_running_airflow_version() -> None:
    import airflow

    assert airflow_shared_stream._airflow_version() == airflow.__version__


def test_the_guard_and_pyproject_agree_on_the_lowest_airflow() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    [airflow] = [Requirement(r) for r in project["dependencies"] if Requirement(r).name == "apache-airflow"]
    [lower] = [spec for spec in airflow.specifier if spec.operator == ">="]

    assert lower.version == MIN_AIRFLOW_VERSION
