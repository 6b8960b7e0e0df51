"""
Session-wide test settings: an isolated AIRFLOW_HOME, quiet third-party loggers, and how the
suite splits over pytest-xdist workers.
"""

from __future__ import annotations

import logging
import os
import tempfile
from typing import Any

import pytest

# Before anything imports airflow: never read or write the developer's ~/airflow. Each xdist
# worker gets its own (the workers inherit the controller's environment, and so its directory).
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ["AIRFLOW_HOME"] = tempfile.mkdtemp(prefix="airflow-shared-stream-tests-")
else:
    os.environ.setdefault("AIRFLOW_HOME", tempfile.mkdtemp(prefix="airflow-shared-stream-tests-"))
os.environ.setdefault("AIRFLOW__CORE__LOAD_EXAMPLES", "False")

logging.getLogger("werkzeug").setLevel(logging.WARNING)

AIRFLOW_AND_SPARK = ("tests/e2e/", "tests/integration/spark/")
"""Tests that run Airflow deployments or Spark JVMs: one xdist worker runs all of them, in order."""

NO_JVM_IN_SPARK = (
    "tests/integration/spark/test_recording_master.py",
    "tests/integration/spark/test_bench_smoke.py",
)
"""Spark tests against the fake master only (no JVM): off the critical path, with the brokers."""


SQS_AND_FAULTS = ("tests/integration/sqs/", "tests/reliability/")
"""SQS integration tests (waiting on visibility timeouts and redeliveries) and the fault scenarios
(waiting on kills, outages and redeliveries of every broker)."""

PUBSUB_AND_SERVICE_BUS = ("tests/integration/pubsub/", "tests/integration/servicebus/")
"""Pub/Sub and Service Bus integration tests: mostly waiting on ack deadlines, locks and redeliveries."""


def worker_group(nodeid: str) -> str:
    """
    Which of the four xdist workers runs a test (``scripts/test.sh`` runs ``-n 4``).

    The Airflow deployments and Spark clusters (e2e, Spark integration) are the longest group
    under load; the other three are cut to finish before it: the SQS integration tests with the
    fault scenarios; the Pub/Sub and Service Bus integration tests; everything else (Kafka, the
    contract mutants, unit tests, docs, the Spark tests that only talk to a fake master). The two
    leased-queue groups spend most of their time waiting for leases, locks, redeliveries and
    outages rather than on a core (split so their waits are about even), so four workers fit two
    cores. A group runs on one worker in collection order, so module- and session-scoped fixtures
    (the e2e deployments, one Spark cluster, one emulator) are built once, and two Airflow
    deployments or Spark clusters never compete for the machine's two cores at once.
    """
    if nodeid.startswith(AIRFLOW_AND_SPARK) and not nodeid.startswith(NO_JVM_IN_SPARK):
        return "airflow-and-spark"
    if nodeid.startswith(SQS_AND_FAULTS):
        return "sqs-and-faults"
    if nodeid.startswith(PUBSUB_AND_SERVICE_BUS):
        return "pubsub-and-service-bus"
    return "brokers"


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """
    xdist's scope scheduler with :func:`worker_group` as the scope.

    (``--dist loadgroup`` with ``xdist_group`` marks would say the same, but pytest 9.2 builds
    node ids in a way xdist 3.8's group suffix no longer reaches, and the groups are ignored.)
    """
    from xdist.scheduler import LoadScopeScheduling

    class WorkerGroups(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return worker_group(nodeid)

    return WorkerGroups(config, log)


GROUP_SECONDS: dict[str, float] = {}
"""Seconds of setup, call and teardown per worker group, summed as the reports come in."""


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    group = worker_group(report.nodeid)
    GROUP_SECONDS[group] = GROUP_SECONDS.get(group, 0.0) + report.duration


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """Each worker group's time: the longest is the suite's wall time (what to split next)."""
    if GROUP_SECONDS:
        spent = ", ".join(f"{group} {seconds:.0f} s" for group, seconds in sorted(GROUP_SECONDS.items()))
        terminalreporter.write_line(f"time per worker group: {spent}")


@pytest.fixture(autouse=True)
def _forget_resolved_connections() -> Any:
    """What a stream key read from a connection is remembered per process: not across tests."""
    yield
    from airflow_shared_stream.common.trigger import connection_endpoints

    connection_endpoints.clear()
