"""
Report streams whose watchers run on more than one triggerer (docs/ha.rst).

Airflow assigns triggers to triggerers with no regard to their shared-stream key, so with two or
more triggerers the watchers of one queue end up on several of them, each with its own consumer.
A leased queue (SQS, Pub/Sub, Service Bus) hands each message to ONE consumer: every watcher then
sees only the share its own triggerer received, silently. Kafka is safe (every triggerer reads
every partition and every watcher keeps its own position), but the placement is still reported.

Where the fact is observable: only the metadata database knows where every trigger runs (the
``trigger`` table's ``triggerer_id``); a trigger runner has no database access and sees only its
own process. So each triggerer's *supervisor* process (which has the database) runs a daemon
thread, started by this provider's listener when the triggerer job starts, that every
``[shared_stream] split_stream_check_interval`` seconds reads this provider's triggers assigned
to live triggerers, groups them by stream key, and for every stream this triggerer runs:

* sends the gauge ``shared_stream.<broker>.<stream>.triggerers`` (how many triggerers run it);
* logs an ERROR naming the stream and the triggerers when a leased queue runs on more than one,
  with what to do about it; for Kafka an INFO line.

The stream key is the broker-side entity (docs/concepts.rst, "Stream identity"), resolved here
as in the triggerer: a Service Bus key holds the namespace the connection names, read from the
metadata database like any connection of the supervisor. Watchers that reach one queue through
two connection ids, or two spellings of one URL, are therefore one stream here too, and the
report names every spelling of it.

The check is one indexed query per interval per triggerer, reads kwargs as Airflow decrypts them,
and logs no kwargs but the identity arguments (names, URLs and connection ids, never a secret)
beside the stream label the metrics use.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Hashable, Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Any

from airflow.listeners import hookimpl

from airflow_shared_stream import runner_fork
from airflow_shared_stream.common.figures import metric_label
from airflow_shared_stream.common.metrics import StreamMetrics
from airflow_shared_stream.execution_api_warmup import triggerer_job_id

log = logging.getLogger(__name__)

CONFIG_SECTION = "shared_stream"
CONFIG_KEY = "split_stream_check_interval"
"""``[shared_stream] split_stream_check_interval``: seconds between checks; 0 turns them off."""
DEFAULT_INTERVAL = 60.0
CLASSPATH_PREFIX = "airflow_shared_stream."

TRIGGERERS = "triggerers"
"""Gauge: how many live triggerers run watchers of the stream (more than 1 splits a leased queue)."""


@dataclass
class StreamPlacement:
    """Where the watchers of one stream run."""

    key: Hashable
    broker: str
    label: str
    every_triggerer_reads_everything: bool
    watchers: dict[int, int] = field(default_factory=dict)
    """triggerer (job) id -> how many of the stream's watchers it runs."""
    spellings: set[str] = field(default_factory=set)
    """How the watchers name the stream (their identity arguments as given; secret-free)."""

    @property
    def split(self) -> bool:
        return len(self.watchers) > 1

    def describe(self) -> str:
        where = ", ".join(f"{n} on triggerer {job}" for job, n in sorted(self.watchers.items()))
        described = f"{self.broker} stream {self.label!r} ({where})"
        if len(self.spellings) > 1:
            described += f", named as {' and as '.join(sorted(self.spellings))}"
        return described


def stream_placements(rows: Iterable[tuple[str, dict[str, Any], int]]) -> list[StreamPlacement]:
    """
    Group ``(classpath, kwargs, triggerer_id)`` rows of this provider's triggers by stream key.

    Rows that are not shared-stream triggers of this provider, or whose kwargs no longer build a
    trigger (an older version's), are skipped: the check must never fail the triggerer.
    """
    from airflow.sdk.module_loading import import_string

    from airflow_shared_stream.common.trigger import SharedStreamTrigger

    found: dict[Hashable, StreamPlacement] = {}
    for classpath, kwargs, triggerer_id in rows:
        try:
            trigger_class = import_string(classpath)
            if not (isinstance(trigger_class, type) and issubclass(trigger_class, SharedStreamTrigger)):
                continue
            trigger = trigger_class(**kwargs)
            key = trigger.shared_stream_key()
        except Exception as exc:
            log.debug("Not checking the placement of a %s trigger: %s", classpath, type(exc).__name__)
            continue
        placement = found.get(key)
        if placement is None:
            placement = found[key] = StreamPlacement(
                key=key,
                broker=trigger_class.broker,
                label=metric_label(trigger),
                every_triggerer_reads_everything=trigger_class.every_triggerer_reads_everything,
            )
        placement.watchers[triggerer_id] = placement.watchers.get(triggerer_id, 0) + 1
        placement.spellings.add(_spelling(trigger))
    return list(found.values())


def _spelling(trigger: Any) -> str:
    """The identity arguments as the watcher gives them: connection ids, names, URLs."""
    given = ((name, getattr(trigger, name, None)) for name in trigger.identity_fields)
    return ", ".join(f"{name}={value!r}" for name, value in given if value is not None)


def report(placements: Iterable[StreamPlacement], triggerer_id: int) -> None:
    """Send the gauge and log, for every stream that ``triggerer_id`` runs watchers of."""
    for placement in placements:
        if triggerer_id not in placement.watchers:
            continue
        StreamMetrics(placement.broker, placement.label).gauge(TRIGGERERS, len(placement.watchers))
        if not placement.split:
            continue
        if placement.every_triggerer_reads_everything:
            log.info(
                "Watchers of %s run on %d triggerers; each triggerer reads the whole stream and each "
                "watcher keeps its own position, so none misses a message",
                placement.describe(),
                len(placement.watchers),
            )
            continue
        log.error(
            "Watchers of %s run on %d triggerers: each message of a %s queue goes to ONE triggerer, "
            "so every watcher sees only part of the stream. Give each watcher its own copy (an SNS "
            "topic fanning out to a queue per watcher, a Pub/Sub subscription or a Service Bus topic "
            "subscription per watcher), or run these watchers on one triggerer. See docs/ha.rst",
            placement.describe(),
            len(placement.watchers),
            placement.broker,
        )


def read_placements(session: Any) -> list[StreamPlacement]:
    """This provider's triggers assigned to live triggerers, grouped by stream (one query)."""
    from airflow.configuration import conf
    from airflow.jobs.job import Job
    from airflow.models.trigger import Trigger
    from sqlalchemy import select

    threshold = conf.getfloat("triggerer", "triggerer_health_check_threshold")
    alive = select(Job.id).where(
        Job.job_type == "TriggererJob",
        Job.end_date.is_(None),
        Job.latest_heartbeat > datetime.now(timezone.utc) - timedelta(seconds=threshold),
    )
    triggers = session.scalars(
        select(Trigger).where(
            Trigger.classpath.startswith(CLASSPATH_PREFIX),
            Trigger.triggerer_id.in_(alive),
        )
    )
    return stream_placements((t.classpath, t.kwargs, t.triggerer_id) for t in triggers)


def check_interval() -> float:
    from airflow.configuration import conf

    return conf.getfloat(CONFIG_SECTION, CONFIG_KEY, fallback=DEFAULT_INTERVAL)


class PlacementMonitor(threading.Thread):
    """The daemon thread of one triggerer job (see the module docstring)."""

    def __init__(self, job: Any, interval: float, forked: threading.Event | None = None) -> None:
        super().__init__(name="shared-stream-placement-monitor", daemon=True)
        self.job = job
        self.interval = interval
        self.forked = forked
        self.stopped = threading.Event()

    def run(self) -> None:
        job_id = self._wait_for_triggerer_job()
        if job_id is None:
            return
        from airflow.utils.session import create_session

        log.info("Checking every %.0f s where the watchers of this triggerer's streams run", self.interval)
        while not self.stopped.wait(self.interval):
            try:
                with create_session() as session:
                    placements = read_placements(session)
                report(placements, job_id)
            except Exception as exc:  # never let the check hurt the triggerer
                log.warning("Checking where shared-stream watchers run failed: %s", type(exc).__name__)

    def _wait_for_triggerer_job(self, timeout: float = 300.0) -> int | None:
        return triggerer_job_id(self.job, self.stopped, timeout, forked=self.forked)


class PlacementListener:
    """Starts a :class:`PlacementMonitor` per triggerer job and has its fork hooks registered."""

    def __init__(self) -> None:
        self.monitors: list[PlacementMonitor] = []

    @hookimpl
    def on_starting(self, component: Any) -> None:
        if not hasattr(component, "job_type"):
            return
        runner_fork.watch(component)  # also readies the Execution API before the runner's fork
        interval = check_interval()
        if interval <= 0:
            return
        monitor = PlacementMonitor(component, interval, forked=runner_fork.runner_forked)
        monitor.start()
        self.monitors.append(monitor)

    @hookimpl
    def before_stopping(self, component: Any) -> None:
        for monitor in [each for each in self.monitors if each.job is component]:
            monitor.stopped.set()
            self.monitors.remove(monitor)
