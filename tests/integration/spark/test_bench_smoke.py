"""The status-poller benchmark's short form: the script runs, and the shared poller's claim holds."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

ROOT = Path(__file__).parents[3]


def test_status_poller_benchmark_smoke(tmp_path):
    out = tmp_path / "smoke"
    done = subprocess.run(
        [
            sys.executable,
            str(ROOT / "bench" / "spark_status_poller.py"),
            *("--counts", "20", "--steady", "1", "--spread", "1", "--no-real", "--no-plot"),
            *("--out", str(out)),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    results = {r["mode"]: r for r in json.loads(out.with_suffix(".json").read_text())["results"]}
    assert results["per-trigger"]["events"] == results["shared"]["events"] == 20
    # 20 triggers at a 1 s interval: about 20 requests/s each polling alone, about 1 shared.
    assert results["per-trigger"]["requests_per_s"] >= 10, results
    assert results["shared"]["requests_per_s"] <= 2, results
    assert "| fake | 20 | shared |" in out.with_suffix(".md").read_text()
