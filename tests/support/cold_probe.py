"""Run a probe module in a fresh interpreter against moto: where the broker SDK really is cold."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.support.brokers import SqsServer

REPO = Path(__file__).resolve().parents[2]


def run_cold_probe(probe_module: str, sqs: SqsServer) -> dict[str, Any]:
    """
    Give ``probe_module`` (run with ``-m``) a queue holding one message and the default AWS
    connection to moto; its last line of output is its JSON answer.
    """
    queue_url = sqs.create_queue()
    sqs.send(queue_url, [{"n": 1}])
    result = subprocess.run(
        [sys.executable, "-m", probe_module, queue_url],
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
