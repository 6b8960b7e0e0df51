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

import pytest

from tests.support.brokers import SqsServer

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[3]


def test_a_cold_stream_imports_its_sdk_off_the_event_loop(sqs: SqsServer) -> None:
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
    found = json.loads(result.stdout.strip().splitlines()[-1])
    assert found["imported_on_the_loop"] == [], (
        f"{len(found['imported_on_the_loop'])} SDK modules imported on the loop's thread, first "
        f"{found['imported_on_the_loop'][:5]}"
    )
