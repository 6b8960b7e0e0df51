"""A real StatsD listener on loopback, and Airflow's metrics pointed at it (integration tests)."""

from __future__ import annotations

import contextlib
import os
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


@contextlib.contextmanager
def statsd_listening() -> Iterator[StatsdListener]:
    """
    Airflow's [metrics] StatsD settings pointed at a listener, initialised as the triggerer does;
    restored (metrics off, settings as they were) when the block ends. For scripts and fixtures.
    """
    from airflow._shared.observability.metrics import stats
    from airflow._shared.observability.metrics.base_stats_logger import NoStatsLogger
    from airflow.observability.metrics import stats_utils

    listener = StatsdListener()
    settings = {
        "AIRFLOW__METRICS__STATSD_ON": "True",
        "AIRFLOW__METRICS__STATSD_HOST": "127.0.0.1",
        "AIRFLOW__METRICS__STATSD_PORT": str(listener.port),
        "AIRFLOW__METRICS__STATSD_PREFIX": "airflow",
    }
    saved = {name: os.environ.get(name) for name in settings}
    os.environ.update(settings)
    stats.initialize(factory=stats_utils.get_stats_factory(), export_legacy_names=False)
    try:
        yield listener
    finally:
        stats.initialize(factory=NoStatsLogger, export_legacy_names=False)
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        listener.socket.close()


@pytest.fixture
def statsd() -> Iterator[StatsdListener]:
    """Airflow's [metrics] StatsD settings pointed at a listener, initialised as the triggerer does."""
    with statsd_listening() as listener:
        yield listener
