"""
Shared-stream metrics, sent through Airflow's own ``Stats``.

Going through Airflow's stats facade means StatsD, DogStatsD and OpenTelemetry all work as the
deployment's ``[metrics]`` section configures them, and nothing is sent when metrics are off.
Every metric is per stream: the name carries the broker and a secret-free label of the stream
(``shared_stream.sqs.orders_fifo.received``) for plain StatsD, and the same two values are passed
as ``broker`` and ``stream`` tags for backends that take tags. docs/metrics.rst lists them all.

Metric names never contain credentials: the stream label is built from the upstream's name
(queue, topic, subscription), never from a connection or a URL's user part.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sys
import time
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

from airflow_shared_stream.common.figures import stream_figures
from airflow_shared_stream.common.metric_names import (
    ACKED,
    ADVANCE_LATENCY,
    ALL_METRICS,
    BROKER_LAG,
    CREDIT_WAITS,
    DEAD_LETTERED,
    FANNED_OUT,
    IN_FLIGHT,
    LEASE_EXTENSIONS,
    LEASE_LOSSES,
    NO_SUBSCRIBER,
    PREFIX,
    RECEIVED,
    REDELIVERED,
    WATCHER_FAILURES,
    stream_label,
)

if TYPE_CHECKING:
    from airflow.triggers.shared_stream import AdvanceItem

log = logging.getLogger(__name__)

__all__ = [
    "ACKED",
    "ADVANCE_LATENCY",
    "ALL_METRICS",
    "BROKER_LAG",
    "CREDIT_WAITS",
    "DEAD_LETTERED",
    "FANNED_OUT",
    "FLUSH_INTERVAL_SECONDS",
    "IN_FLIGHT",
    "LEASE_EXTENSIONS",
    "LEASE_LOSSES",
    "NO_SUBSCRIBER",
    "PREFIX",
    "RECEIVED",
    "REDELIVERED",
    "WATCHER_FAILURES",
    "StreamMetrics",
    "stream_label",
]

FLUSH_INTERVAL_SECONDS = 1.0
"""Counters and gauges of a stream are sent at most this often (timers are sent as they come).

A stream counts several things per message, and a ``Stats`` call per count is a large part of
its cost per message. StatsD aggregates counters over its own flush interval (10 s by default)
and keeps only a gauge's last value, so sending a second's sum, and the last gauge value, shows
the same graphs for a fraction of the calls."""


_stats_module: Any = None


def _stats() -> Any:
    # The triggerer initialises core's stats module (airflow.observability.stats) from
    # [metrics]; the SDK's copy is only initialised in task processes. Producers run in the
    # triggerer, so they must send through core's. Looked up once: a stream sends several
    # metrics per message.
    global _stats_module
    if _stats_module is None:
        import importlib

        try:
            _stats_module = importlib.import_module("airflow.observability.stats")
        except ImportError:  # pragma: no cover - an Airflow without the core module
            _stats_module = importlib.import_module("airflow.sdk.observability.stats")
    return _stats_module


def warm_up_metrics_registry() -> None:
    """Build Airflow's metrics registry (a pure-Python YAML parse) now; never raises."""
    builder = getattr(sys.modules.get(getattr(_stats().incr, "__module__", ""), None), "_get_registry", None)
    if callable(builder):
        with contextlib.suppress(Exception):
            builder()


def warm_up_stats() -> None:
    """
    Build Airflow's stats backend and metrics registry now, in the calling (worker) thread.

    Airflow builds both on the first metric a process sends: the registry parses Airflow's YAML
    list of metrics in pure Python, which held the triggerer's event loop for a third of a second
    on a loaded machine when a stream sent its first metric. Never raises: a metric must not
    fail a stream.
    """
    module = sys.modules.get(getattr(_stats().incr, "__module__", ""))
    for builder_name in ("_get_backend", "_get_registry"):
        builder = getattr(module, builder_name, None)
        if callable(builder):
            with contextlib.suppress(Exception):
                builder()


class StreamMetrics:
    """
    The metrics of one stream, named ``shared_stream.<broker>.<stream>.<metric>``.

    Never raises: a metrics backend that fails must not fail a stream, so every send is
    guarded and logged at debug level.

    Counted several times per message, so counters and gauges are coalesced: inside an event
    loop they are kept in a dict and sent together :data:`FLUSH_INTERVAL_SECONDS` after the
    first change (one timer per interval, nothing while the stream is idle); outside one (a
    thread, a test) they are sent at once. The owner calls :meth:`flush` when the stream closes,
    so nothing counted is left unsent. Names are built once per metric and the stats module is
    looked up once.
    """

    def __init__(
        self,
        broker: str,
        stream: str,
        *,
        flush_interval: float = FLUSH_INTERVAL_SECONDS,
        stream_id: str | None = None,
    ) -> None:
        self.broker = stream_label(broker)
        self.stream = stream_label(stream)
        self.stream_id = stream_id
        """The stream's identity for the console's figures (set when its producer is built for a
        stream); ``None`` keeps no figures. The label above is for display only: two upstreams
        can share one."""
        self.tags = {"broker": self.broker, "stream": self.stream}
        self.flush_interval = flush_interval
        self._names: dict[str, str] = {}
        self._counts: dict[str, int] = {}
        self._gauges: dict[str, float] = {}
        self._flush_timer: asyncio.TimerHandle | None = None

    def name(self, metric: str) -> str:
        name = self._names.get(metric)
        if name is None:
            name = self._names[metric] = f"{PREFIX}.{self.broker}.{self.stream}.{metric}"
        return name

    def incr(self, metric: str, count: int = 1) -> None:
        if count <= 0:
            return
        counts = self._counts
        counts[metric] = counts.get(metric, 0) + count
        if self._flush_timer is None:
            self._schedule_flush()

    def gauge(self, metric: str, value: float) -> None:
        self._gauges[metric] = value
        if self._flush_timer is None:
            self._schedule_flush()

    def acks_queued(self, acked: int, fanned_out: int, in_flight: int) -> None:
        """
        One advance whose every message settles ACK: ``incr`` twice and ``gauge`` once, in one call.

        The leased queues' common advance, often of a single message: three calls of their own
        were a measurable part of its cost per message.
        """
        counts = self._counts
        counts[ACKED] = counts.get(ACKED, 0) + acked
        counts[FANNED_OUT] = counts.get(FANNED_OUT, 0) + fanned_out
        self._gauges[IN_FLIGHT] = in_flight
        if self._flush_timer is None:
            self._schedule_flush()

    def settled(
        self, batch: Sequence[AdvanceItem], *, acked: int, redelivered: int, dead_lettered: int
    ) -> int:
        """
        Count one advance that is not all ACKs: its settlements, its fan-out, the messages nobody
        was subscribed to and the failed deliveries. Returns how many messages nobody saw.
        """
        fanned_out = nobody = failed = failed_messages = 0
        for item in batch:  # one pass: this runs once per message at one watcher
            outcome = item.outcome
            resolved = outcome.acked + outcome.failed + outcome.rejected
            fanned_out += resolved
            if resolved == 0:
                nobody += 1
            elif outcome.failed:
                failed += outcome.failed
                failed_messages += 1
        self.incr(ACKED, acked)
        self.incr(REDELIVERED, redelivered)
        self.incr(DEAD_LETTERED, dead_lettered)
        self.incr(NO_SUBSCRIBER, nobody)
        self.incr(FANNED_OUT, fanned_out)
        self.failed_deliveries(failed, failed_messages)
        return nobody

    def timing_ms(self, metric: str, milliseconds: float) -> None:
        try:
            _stats().timing(self.name(metric), milliseconds, tags=self.tags)
        except Exception as exc:  # pragma: no cover - depends on the deployment's backend
            _failed(exc)

    def _schedule_flush(self) -> None:
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # no event loop in this thread: nothing would run a timer
            self.flush()
            return
        self._flush_timer = loop.call_later(self.flush_interval, self.flush)

    def flush(self) -> None:
        """Send the counters and gauges kept since the last flush."""
        if self._flush_timer is not None:
            self._flush_timer.cancel()
            self._flush_timer = None
        counts, self._counts = self._counts, {}
        gauges, self._gauges = self._gauges, {}
        stream_figures.absorb(self, counts, gauges)
        for metric, count in counts.items():
            try:
                _stats().incr(self.name(metric), count, tags=self.tags)
            except Exception as exc:  # pragma: no cover - depends on the deployment's backend
                _failed(exc)
        for metric, value in gauges.items():
            try:
                _stats().gauge(self.name(metric), value, tags=self.tags)
            except Exception as exc:  # pragma: no cover - depends on the deployment's backend
                _failed(exc)

    def failed_deliveries(self, failed: int, messages: int) -> None:
        """
        Surface watchers that did not finish ``messages`` messages (``failed`` deliveries in all).

        Airflow's ack timeout fails such a watcher but cannot cancel it, and nothing else tells
        the deployment why messages come back, so count the failed deliveries and log one
        warning per advance.
        """
        if failed <= 0:
            return
        self.incr(WATCHER_FAILURES, failed)
        log.warning(
            "%d message(s) of %s stream %s were not finished by every watcher (%d failed "
            "deliveries: a trigger failed, or its filter hung or its events were not persisted "
            "within [triggerer] shared_stream_ack_timeout); redelivering them",
            messages,
            self.broker,
            self.stream,
            failed,
        )

    @contextlib.contextmanager
    def timed(self, metric: str) -> Iterator[None]:
        """Record the block's wall time in milliseconds, whether it raised or not."""
        start = time.monotonic()
        try:
            yield
        finally:
            self.timing_ms(metric, (time.monotonic() - start) * 1000.0)


def _failed(exc: Exception) -> None:
    log.debug("Sending a shared-stream metric failed: %s", type(exc).__name__)
