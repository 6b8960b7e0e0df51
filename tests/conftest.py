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


SQS_FAULTS_AND_BENCH = ("tests/integration/sqs/", "tests/reliability/", "tests/integration/bench/")
"""SQS integration tests (waiting on visibility timeouts and redeliveries), the fault scenarios
(waiting on kills, outages and redeliveries of every broker) and the benchmarks' smoke runs."""

ONE_FILE_SCENES = "tests/integration/test_"
"""The integration tests of no broker's folder (installs, triggerer processes, coexisting providers)."""

PUBSUB_AND_SERVICE_BUS = ("tests/integration/pubsub/", "tests/integration/servicebus/")
"""Pub/Sub and Service Bus integration tests: mostly waiting on ack deadlines, locks and redeliveries."""


def worker_group(nodeid: str) -> str:
    """
    Which of the four xdist workers runs a test (``scripts/test.sh`` runs ``-n 4``).

    The Airflow deployments and Spark clusters (e2e, Spark integration) are the longest group
    under load; the other three are cut to finish before it: the SQS integration tests with the
    fault scenarios, the benchmarks' smoke runs and the one-file integration scenes; the Pub/Sub
    and Service Bus integration tests; everything else (Kafka, the contract mutants, unit tests,
    docs, the Spark tests that only talk to a fake master). The two
    leased-queue groups spend most of their time waiting for leases, locks, redeliveries and
    outages rather than on a core (split so their waits are about even), so four workers fit two
    cores. A group runs on one worker in collection order, so module- and session-scoped fixtures
    (the e2e deployments, one Spark cluster, one emulator) are built once, and two Airflow
    deployments or Spark clusters never compete for the machine's two cores at once.
    """
    if nodeid.startswith(AIRFLOW_AND_SPARK) and not nodeid.startswith(NO_JVM_IN_SPARK):
        return "airflow-and-spark"
    if nodeid.startswith(SQS_FAULTS_AND_BENCH) or (
        nodeid.startswith(ONE_FILE_SCENES) and "/" not in nodeid.split("::")[0][len(ONE_FILE_SCENES) :]
    ):
        return "sqs-faults-and-bench"
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

FILE_SECONDS: dict[tuple[str, str], float] = {}
"""The same per test file, to see what to move when one group outgrows the others."""


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    group = worker_group(report.nodeid)
    GROUP_SECONDS[group] = GROUP_SECONDS.get(group, 0.0) + report.duration
    key = (group, report.nodeid.split("::")[0])
    FILE_SECONDS[key] = FILE_SECONDS.get(key, 0.0) + report.duration


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """Each worker group's time (the longest is the suite's wall time) and its slowest files."""
    if not GROUP_SECONDS:
        return
    spent = ", ".join(f"{group} {seconds:.0f} s" for group, seconds in sorted(GROUP_SECONDS.items()))
    terminalreporter.write_line(f"time per worker group: {spent}")
    for group in sorted(GROUP_SECONDS):
        files = sorted(((s, f) for (g, f), s in FILE_SECONDS.items() if g == group), reverse=True)
        slowest = ", ".join(f"{path} {seconds:.0f} s" for seconds, path in files[:8])
        terminalreporter.write_line(f"  {group}, slowest files: {slowest}")


@pytest.fixture(autouse=True)
def _forget_resolved_connections() -> Any:
    """What a stream key read from a connection is remembered per process: not across tests."""
    yield
    from airflow_shared_stream.common.trigger import connection_endpoints

    connection_endpoints.clear()
