"""
The short form of ``bench/watchers.py``: the script runs end to end on each leased-queue broker
(SQS on moto, Pub/Sub on Google's emulator, Service Bus on the test server in a child process)
and its accounting holds: every message reaches every watcher, requests per message are read off
the wire (or the SDK, or the server) and stay flat in the watcher count, the in-memory ceiling
and template make no request, and the in-flight hold measures memory. Timing is not checked (the machine is
shared). Kafka's shared-stream cells are the same code path and are left to the full run; its
bare loop, metered apart, is checked here.

The per-watcher anchors (amazon's, google's and azure's triggers) need the ``bench`` extra and
bench/install_official_providers.sh, which the test environment does not install; they run in
the full benchmark.
"""

from __future__ import annotations

import json
import math

import pytest

from bench import watchers as bench_watchers

pytestmark = pytest.mark.integration

MESSAGES = 20

# broker -> (requests that must be there in the bare loop, the most requests/message ours may use)
EXPECTED = {
    "sqs": ({"ReceiveMessage", "DeleteMessageBatch"}, 0.5),
    "pubsub": ({"pull", "acknowledge"}, 0.5),
    # One settlement per message, plus the stream's set-up (connection, token, links: 8 requests),
    # which weighs 0.4 per message over 20 messages.
    "servicebus": ({"receive", "settle"}, 2.0),
}


@pytest.mark.timeout(180)
@pytest.mark.parametrize("broker", sorted(EXPECTED))
def test_the_watchers_benchmark_runs_and_counts_requests_per_message(tmp_path, broker):
    results = bench_watchers.main(
        [
            "--broker",
            broker,
            "--watchers",
            "1",
            "3",
            "--variants",
            "ours",
            "ceiling",
            "template",
            "bare",
            "in-flight",
            "--in-flight-window",
            str(MESSAGES),
            "--messages",
            json.dumps({broker: {"1": MESSAGES, "3": MESSAGES}}),
            "--warm-up-messages",
            "10",
            "--budget",
            "60",
            "--output-dir",
            str(tmp_path),
        ]
    )
    cells = {(c.variant, c.watchers): c for c in results[broker]}
    expected = {(v, n) for v in ("ours", "ceiling", "template", "bare") for n in (1, 3)}
    assert set(cells) == expected | {("in-flight", bench_watchers.IN_FLIGHT_WATCHERS)}
    for cell in cells.values():
        assert cell.error is None, cell
        assert cell.delivered == MESSAGES * cell.fanout, cell

    kinds, most = EXPECTED[broker]
    bare = cells[("bare", 1)]
    assert kinds <= set(bare.requests), bare.requests
    assert bare.requests_per_message == pytest.approx(sum(bare.requests.values()) / MESSAGES)

    # Ours: counted through the settlement of the last message, and flat in the watcher count.
    for n in (1, 3):
        ours = cells[("ours", n)]
        assert kinds <= set(ours.requests), ours.requests
        assert ours.requests_per_message < most, ours.requests
    assert cells[("ours", 3)].requests_per_message <= 1.3 * cells[("ours", 1)].requests_per_message
    if broker == "sqs":
        assert cells[("ours", 3)].requests["DeleteMessageBatch"] <= math.ceil(MESSAGES / 10) + 1
    if broker == "servicebus":
        # The bare loop completes message by message; ours completes runs of consecutive
        # deliveries with one disposition each (servicebus/ranges.py).
        assert bare.requests["settle"] == MESSAGES
        assert cells[("ours", 3)].requests["settle"] < MESSAGES / 2

    # The in-memory ceiling and the template over memory make no broker requests.
    assert cells[("ceiling", 1)].requests == {}
    assert cells[("template", 1)].requests == {}

    # The broker's CPU is measured in every timed cell (its process runs on the same cores).
    for cell in cells.values():
        if cell.variant != "in-flight":
            assert cell.broker_cpu_seconds is not None, cell
            assert cell.broker_cpu_seconds >= 0, cell

    held = cells[("in-flight", bench_watchers.IN_FLIGHT_WATCHERS)]
    assert held.heap_per_event_bytes is not None
    assert held.heap_per_event_bytes > 0

    table = (tmp_path / f"watchers_{broker}.md").read_text()
    assert "| 3 | ours |" in table
    assert "| broker CPU s / 1,000 msgs |" in table
    assert "load average" in table
    assert "Memory per in-flight trigger event" in table
    assert json.loads((tmp_path / f"watchers_{broker}.json").read_text())["cells"]


@pytest.mark.timeout(180)
def test_the_kafka_bare_loop_is_metered_like_the_other_variants(tmp_path):
    """Its wall time, this process's CPU and the broker's, from the first record to the last commit."""
    results = bench_watchers.main(
        [
            "--broker",
            "kafka",
            "--kafka-partitions",
            "1",
            "--watchers",
            "1",
            "--variants",
            "bare",
            "ours",
            "--messages",
            json.dumps({"kafka": {"1": 200}}),
            "--warm-up-messages",
            "20",
            "--budget",
            "60",
            "--output-dir",
            str(tmp_path),
        ]
    )
    cells = {c.variant: c for c in results["kafka"]}
    for cell in cells.values():
        assert cell.error is None, cell
        assert cell.delivered == 200, cell
        assert cell.seconds > 0, cell
        assert math.isfinite(cell.cpu_seconds), cell
        assert cell.cpu_seconds > 0, cell
        assert cell.broker_cpu_seconds is not None, cell
    table = (tmp_path / "watchers_kafka.md").read_text()
    bare_row = next(line for line in table.splitlines() if line.startswith("| 1 | bare |"))
    assert "n/a" not in bare_row


@pytest.mark.timeout(180)
def test_the_pubsub_cells_run_on_the_server_with_pubsubs_own_pull_limit(tmp_path):
    """
    ``--pubsub-pull-cap`` (bench/fake_pubsub.py): a pull brings more than the emulator's 100.

    1,000 messages take at least ten pulls from the emulator. Here the bare loop's pulls of up
    to 1,000 take one or two, and ours, which asks for its credits (250 per pull with the default
    window of 500 and two pulls in flight), four and the pulls still open at the end (each
    counted, empty or not).
    """
    messages = 1000
    results = bench_watchers.main(
        [
            "--broker",
            "pubsub",
            "--pubsub-pull-cap",
            "1000",
            "--watchers",
            "1",
            "3",
            "--variants",
            "ours",
            "bare",
            "--messages",
            json.dumps({"pubsub": {"1": messages, "3": messages}}),
            "--warm-up-messages",
            "0",
            "--budget",
            "60",
            "--output-dir",
            str(tmp_path),
        ]
    )
    cells = {(c.variant, c.watchers): c for c in results["pubsub"]}
    assert set(cells) == {("ours", 1), ("ours", 3), ("bare", 1), ("bare", 3)}
    for cell in cells.values():
        assert cell.error is None, cell
        assert cell.delivered == messages * cell.fanout, cell
    bare_pulls = cells[("bare", 1)].requests["pull"]
    assert bare_pulls < messages / 100, cells[("bare", 1)].requests
    for n in (1, 3):
        ours = cells[("ours", n)].requests
        assert 0 < ours["pull"] < messages / 100, ours
        assert ours["acknowledge"] >= 1, ours
    table = (tmp_path / "watchers_pubsub.md").read_text()
    assert "NOT on Google's emulator: on bench/fake_pubsub.py" in table
