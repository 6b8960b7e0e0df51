"""StreamMetrics: cheap per send (several per message), never raises into the stream."""

from __future__ import annotations

import asyncio
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


async def test_in_an_event_loop_counters_and_gauges_are_sent_once_per_interval(stats):
    stream = StreamMetrics("sqs", "orders", flush_interval=0.05)
    for _ in range(1000):
        stream.incr(metrics.RECEIVED)
        stream.gauge(metrics.IN_FLIGHT, 3)
    stream.gauge(metrics.IN_FLIGHT, 0)
    assert stats.sent == []  # one message's worth of Stats calls each, before coalescing
    await asyncio.sleep(0.2)
    tags = {"broker": "sqs", "stream": "orders"}
    assert stats.sent == [
        ("incr", "shared_stream.sqs.orders.received", 1000, tags),
        ("gauge", "shared_stream.sqs.orders.in_flight", 0, tags),
    ]


async def test_flush_sends_what_was_kept_at_once_and_an_idle_stream_sends_nothing(stats):
    stream = StreamMetrics("kafka", "orders", flush_interval=60.0)
    stream.incr(metrics.ACKED, 2)
    stream.incr(metrics.ACKED, 3)
    stream.flush()
    assert [(kind, value) for kind, _, value, _ in stats.sent] == [("incr", 5)]
    stream.flush()
    await asyncio.sleep(0)
    assert len(stats.sent) == 1
