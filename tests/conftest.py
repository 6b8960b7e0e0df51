"""
Session-wide test settings: an isolated AIRFLOW_HOME, quiet third-party loggers, and how the
suite splits over pytest-xdist workers.
"""

from __future__ import annotations

import logging
import os
import tempfile
from pathlib import Path

import pytest

# Before anything imports airflow: never read or write the developer's ~/airflow. Each xdist
# worker gets its own (the workers inherit the controller's environment, and so its directory).
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ["AIRFLOW_HOME"] = tempfile.mkdtemp(prefix="airflow-shared-stream-tests-")
else:
    os.environ.setdefault("AIRFLOW_HOME", tempfile.mkdtemp(prefix="airflow-shared-stream-tests-"))
os.environ.setdefault("AIRFLOW__CORE__LOAD_EXAMPLES", "False")

logging.getLogger("werkzeug").setLevel(logging.WARNING)

TESTS = Path(__file__).resolve().parent
AIRFLOW_AND_SPARK = (TESTS / "e2e", TESTS / "integration" / "spark")
"""Tests that run Airflow deployments or Spark JVMs: one xdist worker runs all of them, in order."""


def xdist_group_of(path: Path) -> str:
    """
    The xdist group of a test file (``scripts/test.sh`` runs ``-n 2 --dist loadgroup``).

    Two groups, one per worker, measured to take about as long as each other: the Airflow
    deployments and Spark clusters (e2e, Spark integration), and everything else (the brokers'
    integration and reliability tests, unit tests). A group runs on one worker in collection
    order, so module- and session-scoped fixtures (an Airflow deployment per e2e module, one Spark
    cluster) are built once, and two Airflow deployments or Spark clusters never compete for the
    machine's two cores at once.
    """
    return "airflow-and-spark" if any(path.is_relative_to(p) for p in AIRFLOW_AND_SPARK) else "brokers"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        item.add_marker(pytest.mark.xdist_group(xdist_group_of(Path(item.fspath))))
