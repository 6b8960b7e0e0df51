"""A real StatsD listener on loopback, and Airflow's metrics pointed at it (integration tests)."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import pytest


class StatsdListener:
    """A UDP socket on loopback that keeps every StatsD line it receives."""

    def __init__(self) -> None:
        self.socket = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.socket.bind(("127.0.0.1", 0))
        self.socket.setblocking(False)
        self.port = self.socket.getsockname()[1]
        self.lines: list[str] = []

    def read(self) -> list[str]:
        while True:
            try:
                data = self.socket.recv(65535)
            except BlockingIOError:
                return self.lines
            self.lines.extend(data.decode().splitlines())

    def counter(self, name: str) -> int:
        return sum(
            int(line.split(":")[1].split("|")[0]) for line in self.read() if line.split(":")[0] == name
        )

    def has(self, name: str) -> bool:
        return any(line.split(":")[0] == name for line in self.read())

    def assert_stream_counts(
        self, prefix: str, *, received: int, fanned_out: int, dead_lettered: int, redelivered: int
    ) -> None:
        """The per-stream counters every broker sends, and the in-flight gauge and advance timer."""
        assert self.counter(f"{prefix}.received") == received
        assert self.counter(f"{prefix}.fanned_out") == fanned_out
        assert self.counter(f"{prefix}.dead_lettered") == dead_lettered
        assert self.counter(f"{prefix}.redelivered") == redelivered
        assert self.has(f"{prefix}.in_flight")
        assert self.has(f"{prefix}.advance_latency")


@pytest.fixture
def statsd(monkeypatch: pytest.MonkeyPatch) -> Iterator[StatsdListener]:
    """Airflow's [metrics] StatsD settings pointed at a listener, initialised as the triggerer does."""
    from airflow._shared.observability.metrics import stats
    from airflow._shared.observability.metrics.base_stats_logger import NoStatsLogger
    from airflow.observability.metrics import stats_utils

    listener = StatsdListener()
    monkeypatch.setenv("AIRFLOW__METRICS__STATSD_ON", "True")
    monkeypatch.setenv("AIRFLOW__METRICS__STATSD_HOST", "127.0.0.1")
    monkeypatch.setenv("AIRFLOW__METRICS__STATSD_PORT", str(listener.port))
    monkeypatch.setenv("AIRFLOW__METRICS__STATSD_PREFIX", "airflow")
    stats.initialize(factory=stats_utils.get_stats_factory(), export_legacy_names=False)
    try:
        yield listener
    finally:
        stats.initialize(factory=NoStatsLogger, export_legacy_names=False)
        listener.socket.close()
