"""
A stream that starts in a triggerer whose broker SDK is not imported yet imports it off the event
loop (issue 50): the first import of aiobotocore, botocore and aiohttp (hundreds of modules) held
the triggerer's loop for seconds on a loaded machine. Checked in a fresh interpreter, where the
SDK really is cold, against moto: which SDK modules the loop's own thread imported.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.support.brokers import SqsServer

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[3]


def _run_cold_start_probe(sqs: SqsServer) -> dict[str, Any]:
    queue_url = sqs.create_queue()
    sqs.send(queue_url, [{"n": 1}])
    result = subprocess.run(
        [sys.executable, "-m", "tests.support.cold_start_probe", queue_url],
        cwd=REPO,
        env={
            **os.environ,
            "PYTHONPATH": str(REPO),
            "AIRFLOW_CONN_AWS_DEFAULT": json.dumps(sqs.connection()),
        },
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    found: dict[str, Any] = json.loads(result.stdout.strip().splitlines()[-1])
    return found


def test_a_cold_stream_imports_its_sdk_off_the_event_loop(sqs: SqsServer) -> None:
    found = _run_cold_start_probe(sqs)
    assert found["imported_on_the_loop"] == [], (
        f"{len(found['imported_on_the_loop'])} SDK modules imported on the loop's thread, first "
        f"{found['imported_on_the_loop'][:5]}"
    )


def test_a_cold_stream_builds_airflows_metrics_registry_off_the_event_loop(sqs: SqsServer) -> None:
    """
    Airflow parses its YAML list of metrics on a process's first metric: a third of a second
    on the loop at a stream's start on a loaded machine. The stream builds it in a worker thread.
    """
    found = _run_cold_start_probe(sqs)
    assert found["metrics_registry_built"], "the stream sent no metric and built no registry"
    assert found["metrics_registry_on_the_loop"] == [], "the metrics registry was built on the loop"
