"""StreamMetrics: cheap per send (several per message), never raises into the stream."""

from __future__ import annotations

from typing import Any

import pytest

from airflow_shared_stream.common import metrics
from airflow_shared_stream.common.metrics import StreamMetrics


class RecordingStats:
    def __init__(self, fail: bool = False) -> None:
        self.sent: list[tuple[str, str, Any, dict[str, str]]] = []
        self.fail = fail

    def _send(self, kind: str, name: str, value: Any, tags: dict[str, str]) -> None:
        if self.fail:
            raise ConnectionError("statsd is down")
        self.sent.append((kind, name, value, tags))

    def incr(self, name: str, count: int, tags: dict[str, str]) -> None:
        self._send("incr", name, count, tags)

    def gauge(self, name: str, value: float, tags: dict[str, str]) -> None:
        self._send("gauge", name, value, tags)

    def timing(self, name: str, value: float, tags: dict[str, str]) -> None:
        self._send("timing", name, value, tags)


@pytest.fixture
def stats(monkeypatch: pytest.MonkeyPatch) -> RecordingStats:
    recording = RecordingStats()
    monkeypatch.setattr(metrics, "_stats_module", recording)
    return recording


def test_sends_named_and_tagged_metrics_and_skips_zero_counts(stats):
    stream = StreamMetrics("sqs", "orders.fifo")
    stream.incr(metrics.ACKED, 3)
    stream.incr(metrics.REDELIVERED, 0)
    stream.gauge(metrics.IN_FLIGHT, 7)
    stream.timing_ms(metrics.ADVANCE_LATENCY, 1.5)
    tags = {"broker": "sqs", "stream": "orders_fifo"}
    assert stats.sent == [
        ("incr", "shared_stream.sqs.orders_fifo.acked", 3, tags),
        ("gauge", "shared_stream.sqs.orders_fifo.in_flight", 7, tags),
        ("timing", "shared_stream.sqs.orders_fifo.advance_latency", 1.5, tags),
    ]


def test_a_metric_name_is_built_once(stats):
    stream = StreamMetrics("kafka", "orders")
    assert stream.name(metrics.ACKED) is stream.name(metrics.ACKED)


def test_a_failing_backend_never_fails_the_stream(monkeypatch):
    monkeypatch.setattr(metrics, "_stats_module", RecordingStats(fail=True))
    stream = StreamMetrics("pubsub", "orders")
    stream.incr(metrics.ACKED)
    stream.gauge(metrics.IN_FLIGHT, 1)
    stream.timing_ms(metrics.ADVANCE_LATENCY, 1.0)
    with stream.timed(metrics.ADVANCE_LATENCY):
        pass
