"""
A stream's live figures, kept by the triggerer and written to the asset state store for the console.

Why the asset state store: it is the channel Airflow 3.3 gives an event trigger to the metadata
database (``BaseEventTrigger.asset_state_store``, written through the triggerer's supervisor and
the execution API): no table of ours, no database access from the trigger runner. It is scoped
to an asset, so a stream's figures are written to the asset of one of its watchers running in
this triggerer (its *carrier*: the one with the lowest trigger id, so a triggerer that takes the
stream over writes the same key again), under a key naming the broker, the stream's identity and
the carrier (:func:`figures_key`). The stream's identity is a digest of its ``shared_stream_key()``
(:func:`figures_stream_id`), as the triggerer groups watchers into streams: two streams with the
same display name (a topic ``orders`` on two clusters) never share figures, and no address or name
beyond the display label is written. A trigger watching several assets (identical watchers in
several Dags share one trigger) writes to the accessor of one of them (:func:`one_asset_writer`).

The console keeps, for each live triggerer (Airflow's ``job`` heartbeat), the newest value whose
carrier that triggerer runs now. A triggerer that dies leaves its last value behind (nothing
deletes it); once its carrier runs on another triggerer, that one writes as the watcher starts
(every watcher start writes at once), so the dead triggerer's value is no longer the newest and
never counts again. (A trigger cannot name its triggerer's job in Airflow 3.3: the trigger
runner's ``job_id`` is never set, so values carry no job id.)

Fed by :class:`~airflow_shared_stream.common.metrics.StreamMetrics` when it flushes (at most once a
second per stream, nothing while the stream is idle), so counting costs the hot path nothing more.
Written at most every ``[shared_stream] figures_publish_interval`` seconds (5) per stream and
triggerer, one write at a time, and never allowed to fail a stream: a write that fails is logged
at debug level and retried with the next flush. Counts are totals since this triggerer started the
stream.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import time
from collections import deque
from collections.abc import Hashable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from airflow_shared_stream.common import metric_names as m
from airflow_shared_stream.common.import_state import imported
from airflow_shared_stream.common.process_scope import scoped

log = logging.getLogger(__name__)

FIGURES_KEY_PREFIX = "shared_stream.figures"
CONFIG_SECTION = "shared_stream"
CONFIG_KEY = "figures_publish_interval"
"""``[shared_stream] figures_publish_interval``: seconds between two writes; 0 turns them off."""
PUBLISH_INTERVAL_SECONDS = 5.0
"""A stream's figures are written at most this often by each triggerer (the page's freshness)."""


def publish_interval() -> float:
    """The configured interval (read when a stream's figures are first kept in this process)."""
    from airflow.configuration import conf

    return conf.getfloat(CONFIG_SECTION, CONFIG_KEY, fallback=PUBLISH_INTERVAL_SECONDS)


HISTORY_SAMPLES = 120
"""Samples kept for the page's chart: ten minutes at one sample per publish."""

COUNTED = (
    m.RECEIVED,
    m.FANNED_OUT,
    m.ACKED,
    m.REDELIVERED,
    m.DEAD_LETTERED,
    m.NO_SUBSCRIBER,
    m.WATCHER_FAILURES,
    m.LEASE_LOSSES,
)
"""The counters the console shows (totals); the other metrics stay StatsD-only."""


def figures_stream_id(shared_stream_key: Hashable) -> str:
    """
    The stream's identity in its figures: a digest of its ``shared_stream_key()``.

    The same in the triggerer and the api-server (the key is a tuple of normalised strings and
    numbers, so its ``repr`` is stable), and secret-free whatever the key holds.
    """
    return hashlib.sha256(repr(shared_stream_key).encode()).hexdigest()[:16]


def figures_key(broker: str, stream_id: str, carrier_trigger_id: int) -> str:
    """The state store key of one stream's figures, as the triggerer running the carrier writes them."""
    return f"{FIGURES_KEY_PREFIX}.{broker}.{stream_id}.{carrier_trigger_id}"


def metric_label(trigger: Any, *, import_producer: bool = True) -> str:
    """
    The stream's metric label, as its producer names it (building a producer does no I/O).

    ``import_producer=False`` on the triggerer's loop: a producer module not imported yet (and
    its broker SDK) is the stream's to import in a worker thread when it opens, so a label from
    the upstream's name stands in until the producer's metrics replace it (``absorb``).
    """
    try:
        module = getattr(trigger, "producer_path", "").partition(":")[0]
        explicit = getattr(type(trigger), "explicit_producer_class", None)
        if not import_producer and (explicit is None or explicit() is None) and not imported(module):
            name = trigger.metrics_stream_name()
            if name is None:
                raise LookupError(f"{module} is imported when the stream opens")
            return m.stream_label(name)
        producer = trigger.resolve_producer_class()(**trigger.producer_kwargs())
        return str(producer.metrics.stream)
    except Exception:
        return m.stream_label(*(str(part) for part in trigger.stream_identity()[:1]))


class CountedStream(Protocol):
    """What the figures need of a stream's :class:`~.metrics.StreamMetrics`: whose counts they are."""

    broker: str
    stream: str
    stream_id: str | None


class AssetStateWriter(Protocol):
    """What a carrier needs of ``BaseEventTrigger.asset_state_store`` (one watched asset)."""

    async def aset(self, key: str, value: Any) -> None: ...


def one_asset_writer(store: Any) -> AssetStateWriter:
    """
    The accessor of one asset of a watcher's state store, the same one on every triggerer.

    Airflow gives a trigger that watches several assets (identical watchers in several Dags are
    one trigger) an ``AssetStateStoreAccessors`` whose own ``aset`` refuses to choose among them
    (``ValueError``). The page reads every asset of the stream, so any one of them will do: the
    first by name, then by URI. Airflow 3.3 offers no public listing of the accessors, so their
    mappings are read; a store of another shape is used as it is.
    """
    by_name = getattr(store, "_by_name", None)
    by_uri = getattr(store, "_by_uri", None)
    if not isinstance(by_name, dict) or not isinstance(by_uri, dict) or len(by_name) + len(by_uri) <= 1:
        return store
    accessors = [by_name[name] for name in sorted(by_name)] + [by_uri[uri] for uri in sorted(by_uri)]
    return accessors[0]


@dataclass
class StreamFigures:
    """One stream's figures in this triggerer process."""

    stream_id: str
    """:func:`figures_stream_id` of the stream's key: what the figures are keyed by."""
    broker: str
    stream: str
    """The stream's display label (its metric label): shown, never used as a key."""
    interval: float = field(default_factory=publish_interval)
    totals: dict[str, int] = field(default_factory=dict)
    gauges: dict[str, float] = field(default_factory=dict)
    last_received_at: float | None = None
    history: deque[tuple[float, int, int, float]] = field(
        default_factory=lambda: deque(maxlen=HISTORY_SAMPLES)
    )
    """(time, received total, dead-lettered total, in flight) at each publish."""
    lag: dict[str, dict[str, int]] = field(default_factory=dict)
    """Kafka: watcher -> ``topic/partition`` -> end offset minus the watcher's position."""
    carriers: dict[int, AssetStateWriter] = field(default_factory=dict)
    """Trigger id -> the state store of a watcher of the stream running in this triggerer."""
    published_at: float = 0.0
    writing: asyncio.Task[None] | None = None
    pending: asyncio.TimerHandle | None = None

    def absorb(self, counts: Mapping[str, int], gauges: Mapping[str, float], now: float) -> None:
        for metric in COUNTED:
            if counts.get(metric):
                self.totals[metric] = self.totals.get(metric, 0) + counts[metric]
        if counts.get(m.RECEIVED):
            self.last_received_at = now
        self.gauges.update((k, v) for k, v in gauges.items() if k == m.IN_FLIGHT)

    def snapshot(self, now: float, carrier_trigger_id: int) -> dict[str, Any]:
        """The JSON value written to the state store (secret-free: counts and the metric label)."""
        return {
            "broker": self.broker,
            "stream": self.stream,
            "stream_id": self.stream_id,
            "carrier_trigger_id": carrier_trigger_id,
            "published_at": round(now, 1),
            "last_received_at": None if self.last_received_at is None else round(self.last_received_at, 1),
            "totals": {metric: self.totals.get(metric, 0) for metric in COUNTED},
            "in_flight": self.gauges.get(m.IN_FLIGHT, 0),
            "history": [list(sample) for sample in self.history],
            "lag": self.lag,
        }

    def publish_due(self, now: float) -> bool:
        return (self.writing is None or self.writing.done()) and now - self.published_at >= self.interval

    async def write(self, now: float) -> None:
        """Take a sample and write the snapshot through the first carrier that takes it."""
        self.history.append(
            (
                round(now, 1),
                self.totals.get(m.RECEIVED, 0),
                self.totals.get(m.DEAD_LETTERED, 0),
                self.gauges.get(m.IN_FLIGHT, 0),
            )
        )
        for trigger_id, store in sorted(self.carriers.items()):
            key = figures_key(self.broker, self.stream_id, trigger_id)
            try:
                await store.aset(key, self.snapshot(now, trigger_id))
            except Exception as exc:
                log.debug("Writing the figures of %s stream %s failed: %s", self.broker, self.stream, exc)
            return


class FiguresPublisher:
    """This triggerer's streams' figures (per triggerer scope, as the harness plays several)."""

    @property
    def streams(self) -> dict[str, StreamFigures]:
        """Stream id (:func:`figures_stream_id`) -> its figures."""
        streams: dict[str, StreamFigures] = scoped("console.figures", dict)
        return streams

    def _figures(self, stream_id: str, broker: str, stream: str) -> StreamFigures:
        figures = self.streams.get(stream_id)
        if figures is None:
            figures = self.streams[stream_id] = StreamFigures(stream_id, broker, stream)
        return figures

    def absorb(self, metrics: CountedStream, counts: Mapping[str, int], gauges: Mapping[str, float]) -> None:
        """
        A stream's metrics flushed these counts and gauges; publish if it is time. Never raises.

        Metrics that name no stream (a redrive, a placement gauge) keep no figures.
        """
        if metrics.stream_id is None:
            return
        try:
            figures = self._figures(metrics.stream_id, metrics.broker, metrics.stream)
            figures.stream = metrics.stream  # the producer's own label, where a watcher's stood in
            now = time.time()
            figures.absorb(counts, gauges, now)
            self._publish_if_due(figures, now)
        except Exception as exc:  # pragma: no cover - figures must never hurt a stream
            log.debug("Keeping the figures of %s stream %s failed: %s", metrics.broker, metrics.stream, exc)

    def set_lag(self, metrics: CountedStream, lag: Mapping[str, Mapping[str, int]]) -> None:
        """
        The stream's lag per watcher and partition, as its producer computed it from what it holds
        (no broker call): written with the next publish. Never raises.
        """
        if metrics.stream_id is None:
            return
        try:
            figures = self._figures(metrics.stream_id, metrics.broker, metrics.stream)
            figures.lag = {w: dict(p) for w, p in lag.items()}
        except Exception as exc:  # pragma: no cover - figures must never hurt a stream
            log.debug("Keeping the lag of %s stream %s failed: %s", metrics.broker, metrics.stream, exc)

    def _publish_if_due(self, figures: StreamFigures, now: float) -> None:
        """Write now if the interval has passed, else once when it has: the last change always lands."""
        if not figures.carriers or figures.interval <= 0:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # no event loop here (a thread, a unit test): nothing can write
            return
        if not figures.publish_due(now):
            if figures.pending is None:
                wait = max(figures.interval - (now - figures.published_at), 0.5)
                figures.pending = loop.call_later(wait, self._publish_pending, figures)
            return
        figures.published_at = now
        figures.writing = loop.create_task(figures.write(now), name=f"shared-stream-figures-{figures.stream}")

    def _publish_pending(self, figures: StreamFigures) -> None:
        figures.pending = None
        self._publish_if_due(figures, time.time())

    @contextlib.contextmanager
    def watching(self, trigger: Any) -> Iterator[None]:
        """
        While a watcher's filter runs, its asset can carry its stream's figures. Never raises.

        A watcher the triggerer gave no state store (the test harness; a trigger with no asset)
        carries nothing, and a stream with no carrier only keeps its figures in memory.
        """
        store = getattr(trigger, "asset_state_store", None)
        figures = None
        trigger_id = getattr(trigger, "trigger_id", None)
        if store is not None and trigger_id is not None:
            try:
                stream_id = figures_stream_id(trigger.shared_stream_key())
                figures = self.streams.get(stream_id)
                if figures is None:
                    label = metric_label(trigger, import_producer=False)
                    figures = self._figures(stream_id, trigger.broker, label)
                figures.carriers[trigger_id] = one_asset_writer(store)
                # Write at once: shows the watcher's stream, and after a takeover makes this
                # triggerer's value newer than what a dead one left under the carrier's key. A
                # triggerer's supervisor readied its Execution API before its runner existed
                # (execution_api_warmup): the write finds it ready, however young the triggerer.
                figures.published_at = 0.0
                self._publish_if_due(figures, time.time())
            except Exception as exc:
                log.debug("Watcher %s cannot carry its stream's figures: %s", trigger_id, exc)
                figures = None
        try:
            yield
        finally:
            if figures is not None:
                figures.carriers.pop(trigger_id, None)  # type: ignore[arg-type]
                if not figures.carriers and figures.pending is not None:
                    figures.pending.cancel()
                    figures.pending = None


stream_figures = FiguresPublisher()
"""The triggerer's publisher: fed by ``StreamMetrics.flush`` and by every watcher's filter."""
