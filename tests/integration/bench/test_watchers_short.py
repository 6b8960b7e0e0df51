"""
The short form of ``bench/watchers.py``: the script runs end to end on a real SQS server and
its requests-per-message accounting holds. Timing is not checked (the machine is shared).

The per-watcher anchor (amazon's ``SqsSensorTrigger``) needs the ``bench`` extra, which the
test environment does not install; it runs in the full benchmark.
"""

from __future__ import annotations

import json
import math

import pytest

from bench import watchers as bench_watchers

pytestmark = pytest.mark.integration

MESSAGES = 20


@pytest.mark.timeout(180)
def test_the_watchers_benchmark_runs_and_counts_requests_per_message(tmp_path):
    results = bench_watchers.main(
        [
            "--broker",
            "sqs",
            "--watchers",
            "1",
            "3",
            "--variants",
            "ours",
            "ceiling",
            "bare",
            "--messages",
            json.dumps({"sqs": {"1": MESSAGES, "3": MESSAGES}}),
            "--budget",
            "60",
            "--output-dir",
            str(tmp_path),
        ]
    )
    cells = {(c.variant, c.watchers): c for c in results["sqs"]}
    assert set(cells) == {(v, n) for v in ("ours", "ceiling", "bare") for n in (1, 3)}
    for cell in cells.values():
        assert cell.error is None, cell
        assert cell.delivered == MESSAGES * cell.fanout, cell

    # The bare loop: one receive and one delete per batch it got, read off the wire.
    bare = cells[("bare", 1)]
    assert bare.requests["ReceiveMessage"] == bare.requests["DeleteMessageBatch"] >= MESSAGES // 10
    assert set(bare.requests) == {"ReceiveMessage", "DeleteMessageBatch"}
    assert bare.requests_per_message == pytest.approx(sum(bare.requests.values()) / MESSAGES)

    # Ours: flat in the watcher count, deletes in (nearly) full batches of ten.
    for n in (1, 3):
        ours = cells[("ours", n)]
        assert ours.requests["DeleteMessageBatch"] <= math.ceil(MESSAGES / 10) + 1, ours.requests
        assert ours.requests_per_message == pytest.approx(sum(ours.requests.values()) / MESSAGES)
        assert ours.requests_per_message < 0.5, ours.requests

    # The in-memory ceiling makes no broker requests.
    assert cells[("ceiling", 1)].requests == {}

    table = (tmp_path / "watchers_sqs.md").read_text()
    assert "| 3 | ours |" in table
    assert "load average" in table
    assert json.loads((tmp_path / "watchers_sqs.json").read_text())["cells"]
