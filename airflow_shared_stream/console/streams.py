"""
What the Streams page shows, read from the metadata database in a few grouped queries (api-server).

* The streams and their watchers: this provider's rows of the ``trigger`` table, rebuilt into
  triggers (as the triggerer rebuilds them) and grouped by ``shared_stream_key()``; each watcher's
  asset (``asset_watcher``), the Dags its asset schedules (``dag_schedule_asset_reference``) and
  the trigger events it fired (its asset's events without a source task).
* Where they run: the ``job`` rows of the triggerers they are assigned to.
* The figures the triggerers publish (:mod:`airflow_shared_stream.common.figures`), from
  ``asset_state_store`` (the default, metastore state backend).
* Warnings already detected elsewhere: a leased queue split across triggerers
  (:mod:`airflow_shared_stream.placement`), stranded asset events
  (:mod:`airflow_shared_stream.scheduling`), a watcher no live triggerer runs, a stream holding
  messages in flight with nothing settled for :data:`STUCK_AFTER_SECONDS`.

Only identity arguments, dead-letter destinations, ``match``/``reject``, names and counts leave
this module: never a trigger's whole kwargs, never a connection's fields, and URLs lose any user
part (:func:`without_userinfo`).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Hashable, Iterable
from dataclasses import asdict, dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from airflow_shared_stream.brokers import broker_operations, registered_brokers
from airflow_shared_stream.common.figures import FIGURES_KEY_PREFIX, figures_stream_id

STUCK_AFTER_SECONDS = 120.0
"""Messages in flight and no figure moved for this long: the stream is reported stuck."""
IDLE_AFTER_SECONDS = 600.0
"""A stream that received nothing for this long is shown idle (ten minutes: the chart's span)."""
STRANDED_GRACE_SECONDS = 60.0
"""An unconsumed event with no queue row younger than this may be a run being created right now."""

STREAM_REDRIVE_PARAMS = ("broker", "conn_id", "source", "dead_letter")
"""The redrive Dag's params the stream decides; the person chooses the rest (``RedriveRequest``)."""


def without_userinfo(value: Any) -> Any:
    """A URL without its ``user:password@`` part; anything else as it is (lists item by item)."""
    if isinstance(value, list | tuple):
        return [without_userinfo(v) for v in value]
    if not isinstance(value, str) or "@" not in value or "://" not in value:
        return value
    parts = urlsplit(value)
    netloc = (parts.hostname or "") + (f":{parts.port}" if parts.port else "")
    return urlunsplit(parts._replace(netloc=netloc))


def stream_id(broker: str, label: str, key: Hashable) -> str:
    """A stable, URL-safe id of a stream (its label, and a digest of its key for uniqueness)."""
    digest = hashlib.sha256(repr(key).encode()).hexdigest()[:8]
    return f"{broker}-{label}-{digest}"


@dataclass
class Watcher:
    trigger_id: int
    names: list[str]
    assets: list[str]
    dags: list[str]
    match: str | None
    reject: str | None
    triggerer_id: int | None
    events_fired: int = 0
    last_event_at: str | None = None


@dataclass
class Stream:
    id: str
    broker: str
    label: str
    upstream: dict[str, Any]
    connection_id: str | None
    dead_letter: Any
    every_triggerer_reads_everything: bool
    own_dead_letter: str | None = None
    """Where the broker keeps the dead letters when the stream names no destination (words)."""
    watchers: list[Watcher] = field(default_factory=list)
    triggerers: list[dict[str, Any]] = field(default_factory=list)
    figures: dict[str, Any] | None = None
    backlog: dict[str, Any] | None = None
    warnings: list[dict[str, str]] = field(default_factory=list)
    state: str = "ok"
    redrive_params: dict[str, Any] = field(default_factory=dict)
    producer_kwargs: dict[str, Any] = field(default_factory=dict)
    """The first watcher's identity and shaping arguments: for the broker probes, never shown."""
    hidden_dags: list[str] = field(default_factory=list)
    """Dags of this stream the viewer may not read (:mod:`.access`): they count, never shown."""
    _key: Hashable = None

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data.pop("_key")
        data.pop("redrive_params")
        data.pop("producer_kwargs")
        data.pop("hidden_dags")
        data["redrive_available"] = bool(self.redrive_params)
        return data


def _build(classpath: str, kwargs: dict[str, Any]) -> Any | None:
    """The trigger a row describes, or ``None`` if it is not one of our shared-stream triggers."""
    from airflow.sdk.module_loading import import_string

    from airflow_shared_stream.common.trigger import SharedStreamTrigger

    try:
        trigger_class = import_string(classpath)
        if not (isinstance(trigger_class, type) and issubclass(trigger_class, SharedStreamTrigger)):
            return None
        return trigger_class(**kwargs)
    except Exception:
        return None


def group_streams(rows: Iterable[tuple[int, str, dict[str, Any], int | None]]) -> list[Stream]:
    """Group ``(trigger id, classpath, kwargs, triggerer id)`` rows into streams (no database)."""
    streams: dict[Hashable, Stream] = {}
    for trigger_id, classpath, kwargs, triggerer_id in rows:
        trigger = _build(classpath, kwargs)
        if trigger is None:
            continue
        try:
            key = trigger.shared_stream_key()
        except Exception:
            continue
        stream = streams.get(key)
        if stream is None:
            broker = type(trigger).broker
            operations = broker_operations(broker)
            if operations is None:
                continue
            label = operations.stream_label(trigger)
            stream = streams[key] = Stream(
                id=stream_id(broker, label, key),
                broker=broker,
                label=label,
                upstream={
                    name: without_userinfo(value) for name, value in operations.upstream(trigger).items()
                },
                connection_id=operations.connection_id(trigger),
                dead_letter=without_userinfo(operations.dead_letter(trigger)),
                every_triggerer_reads_everything=type(trigger).every_triggerer_reads_everything,
                own_dead_letter=operations.own_dead_letter,
                _key=key,
            )
            stream.redrive_params = redrive_params(stream)
            stream.producer_kwargs = trigger.producer_kwargs()
        stream.watchers.append(
            Watcher(
                trigger_id=trigger_id,
                names=[],
                assets=[],
                dags=[],
                match=trigger.match,
                reject=trigger.reject,
                triggerer_id=triggerer_id,
            )
        )
    return sorted(streams.values(), key=lambda s: (s.broker, s.label, s.id))


def redrive_params(stream: Stream) -> dict[str, Any]:
    """
    The redrive Dag's params that name this stream (each a string, as the Dag declares them);
    empty when the page cannot name both ends (each broker says which they are: ``redrive_ends``
    of its ``operations.py``).
    """
    operations = broker_operations(stream.broker)
    ends = operations.redrive_ends(stream.upstream, stream.dead_letter) if operations is not None else None
    if ends is None:
        return {}
    source, dead_letter = ends
    return dict(
        zip(STREAM_REDRIVE_PARAMS, (stream.broker, stream.connection_id, source, dead_letter), strict=True)
    )


def read_streams(session: Any, *, now: datetime | None = None) -> list[Stream]:
    """Every shared stream this deployment runs or should run, with what is known of it."""
    from airflow.configuration import conf
    from airflow.jobs.job import Job
    from airflow.models.asset import AssetModel, AssetWatcherModel, DagScheduleAssetReference
    from airflow.models.trigger import Trigger
    from sqlalchemy import or_, select

    now = now or datetime.now(timezone.utc)
    prefixes = sorted({broker.classpath_prefix for broker in registered_brokers()})
    triggers = session.scalars(
        select(Trigger).where(or_(*(Trigger.classpath.startswith(prefix) for prefix in prefixes)))
    )
    streams = group_streams((t.id, t.classpath, t.kwargs, t.triggerer_id) for t in triggers)
    watchers = {w.trigger_id: w for s in streams for w in s.watchers}
    if not watchers:
        return streams

    asset_ids: dict[int, list[int]] = {}
    names: dict[int, str] = {}
    for row in session.execute(
        select(AssetWatcherModel.trigger_id, AssetWatcherModel.name, AssetModel.id, AssetModel.name)
        .join(AssetModel, AssetModel.id == AssetWatcherModel.asset_id)
        .where(AssetWatcherModel.trigger_id.in_(watchers))
    ):
        watcher = watchers[row[0]]
        watcher.names.append(row[1])
        watcher.assets.append(row[3])
        asset_ids.setdefault(row[0], []).append(row[2])
        names[row[2]] = row[3]
    all_assets = {a for ids in asset_ids.values() for a in ids}
    dags: dict[int, list[str]] = {}
    for asset_id, dag_id in session.execute(
        select(DagScheduleAssetReference.asset_id, DagScheduleAssetReference.dag_id).where(
            DagScheduleAssetReference.asset_id.in_(all_assets)
        )
    ):
        dags.setdefault(asset_id, []).append(dag_id)
    fired = _events_fired(session, all_assets)
    for trigger_id, watcher in watchers.items():
        ids = asset_ids.get(trigger_id, [])
        watcher.dags = sorted({d for a in ids for d in dags.get(a, [])})
        watcher.events_fired = sum(fired.get(a, (0, None))[0] for a in ids)
        newest = [when for a in ids if (when := fired.get(a, (0, None))[1]) is not None]
        watcher.last_event_at = max(newest).isoformat() if newest else None

    threshold = conf.getfloat("triggerer", "triggerer_health_check_threshold")
    triggerer_ids = {w.triggerer_id for w in watchers.values() if w.triggerer_id is not None}
    jobs = (
        {j.id: j for j in session.scalars(select(Job).where(Job.id.in_(triggerer_ids)))}
        if triggerer_ids
        else {}
    )
    alive = {
        job_id
        for job_id, job in jobs.items()
        if job.end_date is None
        and job.latest_heartbeat is not None
        and job.latest_heartbeat > now - timedelta(seconds=threshold)
    }
    figures = _figures(session, all_assets)
    stranded = _stranded_dags(session, {d for ds in dags.values() for d in ds}, now)
    for stream in streams:
        _finish(stream, jobs, alive, figures, stranded, asset_ids, now)
    return streams


def _events_fired(session: Any, asset_ids: set[int]) -> dict[int, tuple[int, datetime | None]]:
    """Asset id -> (count, newest) of its events no task produced: the watchers' trigger events."""
    from airflow.models.asset import AssetEvent
    from sqlalchemy import func, select

    if not asset_ids:
        return {}
    rows = session.execute(
        select(AssetEvent.asset_id, func.count(), func.max(AssetEvent.timestamp))
        .where(AssetEvent.asset_id.in_(asset_ids), AssetEvent.source_task_id.is_(None))
        .group_by(AssetEvent.asset_id)
    )
    return {r[0]: (int(r[1]), r[2]) for r in rows}


def _figures(session: Any, asset_ids: set[int]) -> dict[str, list[dict[str, Any]]]:
    """Stream id (:func:`.figures.figures_stream_id`) -> every published value of it on these assets."""
    from airflow.models.asset_state_store import AssetStateStoreModel
    from sqlalchemy import select

    found: dict[str, list[dict[str, Any]]] = {}
    if not asset_ids:
        return found
    for (value,) in session.execute(
        select(AssetStateStoreModel.value).where(
            AssetStateStoreModel.asset_id.in_(asset_ids),
            AssetStateStoreModel.key.startswith(FIGURES_KEY_PREFIX + "."),
        )
    ):
        try:
            parsed = json.loads(value)
        except ValueError:
            continue
        if isinstance(parsed, dict) and parsed.get("stream_id"):
            found.setdefault(str(parsed["stream_id"]), []).append(parsed)
    return found


def _stranded_dags(session: Any, dag_ids: set[str], now: datetime) -> dict[str, int]:
    """Dag id -> events of its assets no run consumed and no queue row will bring to one."""
    from airflow_shared_stream.scheduling import (
        asset_triggered_floor,
        queued_asset_ids,
        stranded_assets,
        unconsumed_asset_events,
    )

    stranded: dict[str, int] = {}
    for dag_id in sorted(dag_ids):
        floor = asset_triggered_floor(dag_id, session=session)
        if floor is None:
            continue
        unconsumed = unconsumed_asset_events(dag_id, floor, session=session)
        if not unconsumed:
            continue
        settled = now - timedelta(seconds=STRANDED_GRACE_SECONDS)
        late = stranded_assets(unconsumed, queued_asset_ids(dag_id, session=session))
        count = sum(s.events for s in late if s.newest_event < settled)
        if count:
            stranded[dag_id] = count
    return stranded


def merge_figures(
    published: list[dict[str, Any]], running: dict[int, int | None], alive: set[int]
) -> dict[str, Any] | None:
    """
    One stream's figures: for each live triggerer, the newest value whose carrier it runs; summed.

    ``running`` maps the stream's trigger ids to the triggerer job each is assigned to, ``alive``
    holds the live triggerer jobs. What a dead triggerer wrote last stays in the store under its
    carrier's key; once that carrier runs on a live triggerer, the live one has written since
    (every watcher start writes), so the dead value is never the newest and never counts.
    """
    newest: dict[int, dict[str, Any]] = {}
    for value in published:
        carrier = value.get("carrier_trigger_id")
        job = running.get(carrier) if isinstance(carrier, int) else None
        if job is None or job not in alive:
            continue
        if job not in newest or _published_at(value) > _published_at(newest[job]):
            newest[job] = value
    live = list(newest.values())
    if not live:
        return None
    totals: dict[str, int] = {}
    for value in live:
        for metric, count in (value.get("totals") or {}).items():
            totals[metric] = totals.get(metric, 0) + int(count)
    last_received = [v["last_received_at"] for v in live if v.get("last_received_at")]
    longest = max(live, key=lambda v: len(v.get("history") or []))
    lag: dict[str, dict[str, int]] = {}
    for value in live:  # each triggerer reports the partitions it is assigned
        for watcher, partitions in (value.get("lag") or {}).items():
            lag.setdefault(watcher, {}).update(partitions)
    return {
        "published_at": max(float(v.get("published_at") or 0) for v in live),
        "last_received_at": max(last_received) if last_received else None,
        "in_flight": sum(float(v.get("in_flight") or 0) for v in live),
        "totals": totals,
        "history": longest.get("history") or [] if len(live) == 1 else _summed_history(live),
        "lag": lag,
    }


def _published_at(value: dict[str, Any]) -> float:
    return float(value.get("published_at") or 0)


def _summed_history(values: list[dict[str, Any]]) -> list[list[float]]:
    """Several triggerers' samples on the time axis of the one with the most (nearest earlier sample)."""
    base = max(values, key=lambda v: len(v.get("history") or []))["history"]
    summed = []
    for sample in base:
        row = [sample[0], 0.0, 0.0, 0.0]
        for value in values:
            earlier = [s for s in value.get("history") or [] if s[0] <= sample[0]]
            if earlier:
                for i in (1, 2, 3):
                    row[i] += earlier[-1][i]
        summed.append(row)
    return summed


def _finish(
    stream: Stream,
    jobs: dict[int, Any],
    alive: set[int],
    figures: dict[str, list[dict[str, Any]]],
    stranded: dict[str, int],
    asset_ids: dict[int, list[int]],
    now: datetime,
) -> None:
    """Triggerers, figures, warnings and the state at a glance of one stream."""
    per_triggerer: dict[int, int] = {}
    for watcher in stream.watchers:
        if watcher.triggerer_id is not None and watcher.triggerer_id in alive:
            per_triggerer[watcher.triggerer_id] = per_triggerer.get(watcher.triggerer_id, 0) + 1
        else:
            stream.warnings.append(
                {
                    "kind": "unassigned",
                    "trigger_id": str(watcher.trigger_id),
                    "message": "No live triggerer runs watcher "
                    f"{', '.join(watcher.names) or watcher.trigger_id}",
                }
            )
    stream.triggerers = [
        {"id": job_id, "hostname": jobs[job_id].hostname, "watchers": n}
        for job_id, n in sorted(per_triggerer.items())
    ]
    if len(per_triggerer) > 1:
        if stream.every_triggerer_reads_everything:
            stream.warnings.append(
                {
                    "kind": "split",
                    "message": f"Runs on {len(per_triggerer)} triggerers; each reads the whole stream",
                }
            )
        else:
            stream.warnings.append(
                {
                    "kind": "split",
                    "message": f"Split across {len(per_triggerer)} triggerers: each watcher sees only part "
                    "of the queue (docs/ha.rst)",
                }
            )
    running = {w.trigger_id: w.triggerer_id for w in stream.watchers}
    stream.figures = merge_figures(figures.get(figures_stream_id(stream._key), []), running, alive)
    if (
        stream.figures
        and stream.figures["in_flight"] > 0
        and now.timestamp() - stream.figures["published_at"] > STUCK_AFTER_SECONDS
    ):
        stream.warnings.append(
            {
                "kind": "stuck",
                "message": f"{stream.figures['in_flight']:.0f} message(s) in flight and nothing settled "
                f"for over {STUCK_AFTER_SECONDS:.0f} s",
            }
        )
    if stream.figures and stream.figures["totals"].get("watcher_failures"):
        stream.warnings.append(
            {
                "kind": "watcher_failures",
                "message": f"{stream.figures['totals']['watcher_failures']} failed watcher deliveries",
            }
        )
    for dag_id in sorted({d for w in stream.watchers for d in w.dags}):
        if dag_id in stranded:
            stream.warnings.append(
                {
                    "kind": "stranded",
                    "dag_id": dag_id,
                    "message": f"{stranded[dag_id]} asset event(s) for Dag {dag_id} wait for a run no queue "
                    "row will create (set [shared_stream] requeue_stranded_asset_events)",
                }
            )
    kinds = {w["kind"] for w in stream.warnings}
    if not per_triggerer:
        stream.state = "down"
    elif kinds & {"stuck", "unassigned", "stranded"} or (
        "split" in kinds and not stream.every_triggerer_reads_everything
    ):
        stream.state = "warning"
    elif (
        stream.figures is None
        or not stream.figures.get("last_received_at")
        or now.timestamp() - stream.figures["last_received_at"] > IDLE_AFTER_SECONDS
    ):
        stream.state = "idle"
    else:
        stream.state = "ok"
