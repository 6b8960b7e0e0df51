"""
Dead-letter redrive: move dead-lettered messages back to where they came from, at least once.

One loop for every broker, over a small protocol each broker package implements in its
``redrive.py`` (:class:`DeadLetterSource`): read a batch from the dead-letter source, copy the
selected messages to the origin, and only once the broker has accepted a copy take its original
out of the dead-letter source. A redrive killed at any point leaves every message in the
dead-letter source, at the origin, or in both (a duplicate, which at-least-once allows); never in
neither.

A redrive is bounded by a snapshot taken once open, before its first read
(:meth:`DeadLetterSource.snapshot`): the end offsets of a Kafka topic, the approximate depth of a
queue, the time a Pub/Sub or Service Bus read started. It never reads past it, so copies that come
back to the dead-letter source while it runs (a watcher rejects them again) wait for the next
redrive instead of being chased; and it moves at most ``max_messages`` (a default when not given).

On a queue (SQS, Pub/Sub, Service Bus) the messages the ``filter`` leaves, and copies the broker
refuses, are held until the redrive ends, their leases renewed while held, and then given back,
so one redrive reads each message once; what it holds is the broker's handle, not the message's
content. A log (Kafka) holds nothing: a record not committed past is read again by the next
redrive. A dry run copies nothing and removes nothing.

The origin rule: a dead letter goes back only to where it came from. Each broker's source reads
the origin our dead-lettering stamped on it (or the broker's own, where that is unambiguous) and
marks a message it must not move (:attr:`RedriveItem.leave`): from another stream, of an unknown
origin, or a truncated copy that is not the original. Such a message is left untouched, counted
(``left_untouched``) and logged with the reason, never copied anywhere.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from airflow_shared_stream.common.errors import SharedStreamConfigurationError
from airflow_shared_stream.common.matching import EnvelopeMatcher, Verdict
from airflow_shared_stream.common.metrics import StreamMetrics

log = logging.getLogger(__name__)

REDRIVE_MOVED = "redrive_moved"
"""Messages copied to their origin and removed from the dead-letter source."""
REDRIVE_SKIPPED = "redrive_skipped"
"""Messages the redrive's ``filter`` left in the dead-letter source."""
REDRIVE_FAILED = "redrive_failed"
"""Messages whose copy the broker refused: they stay in the dead-letter source."""
REDRIVE_LEFT_UNTOUCHED = "redrive_left_untouched"
"""Messages the origin rule left: another stream's, of no known origin, or a truncated copy."""

DEFAULT_BATCH_SIZE = 10
DEFAULT_SAMPLE_SIZE = 5
DEFAULT_MAX_MESSAGES = 100
"""How many a redrive moves when ``max_messages`` is not given (a blank form field, ``None``)."""
RETURNING_READS_LIMIT = 10
"""Reads in a row made only of messages already held (their leases ran out) before giving up."""


class RedriveConfigurationError(SharedStreamConfigurationError):
    """A redrive's arguments are wrong (broker, filter, max_messages, source or dead-letter names)."""


@dataclass(slots=True)
class RedriveItem:
    """One dead-lettered message as a broker's source read it."""

    key: str
    """The message's identity in the dead-letter source (message id, ``partition@offset``): a
    message read again in the same redrive (its lease ran out while held) is recognised by it."""
    envelope: dict[str, Any]
    """What the triggers would see for this message (the ``filter`` runs over it)."""
    handle: Any = field(repr=False)
    """What the broker's source needs to copy and remove it."""
    past_snapshot: bool = False
    """Reached the dead-letter source after the redrive's snapshot (a copy dead-lettered again):
    held and given back at the end, never examined nor counted."""
    leave: str | None = None
    """Why this redrive must not move it (its origin is elsewhere or unknown, or it is a truncated
    copy), for the log; ``None``: it goes home. Left messages are never copied."""


@dataclass(frozen=True, slots=True)
class RedriveRoute:
    """
    Where a redrive reads and where it writes, as the broker identifies them (``None``: not known yet).

    ``read_from`` is what a message written to the destination would land in: the dead-letter
    queue or topic itself, or the topic a dead-letter subscription reads. Equal to ``write_to``,
    every message moved comes straight back to the dead-letter source.
    """

    kind: str
    """What the two are (``queue``, ``topic``), for the error."""
    read_from: Hashable | None
    write_to: Hashable | None


def refuse_loop(source: DeadLetterSource) -> None:
    """Refuse a redrive whose destination feeds its own dead-letter source; each broker says its route."""
    route = source.route
    if route.read_from is not None and route.read_from == route.write_to:
        raise RedriveConfigurationError(
            f"the dead-letter source and the destination of the {source.broker} redrive of "
            f"{source.label!r} are one {route.kind}: every message moved would come straight back"
        )


@dataclass(frozen=True, slots=True)
class RedriveSnapshot:
    """Where a redrive stops, taken once open: the source keeps its own bound, and says a count."""

    depth: int | None
    """How many messages the dead-letter source held (approximate for a queue); ``None``: the
    broker cannot count them without reading them (the source's own bound still holds)."""
    bound: str
    """The bound as the broker states it, for the log (end offsets, a depth, a time)."""


class DeadLetterSource(Protocol):
    """What a broker's ``redrive.py`` implements; see the module docstring for the order of calls."""

    broker: str
    label: str
    """A secret-free name of the dead-letter source, for logs and metrics."""

    @property
    def route(self) -> RedriveRoute:
        """Where it reads and writes: checked (:func:`refuse_loop`) when built and once open."""

    async def open(self) -> None:
        """Connect, and check that the dead-letter source and the origin exist."""

    async def close(self) -> None:
        """Release the connections (best effort)."""

    @property
    def lease_seconds(self) -> float | None:
        """How long a read holds a message before the broker hands it out again; ``None``: reading
        holds nothing (a log), so the engine keeps nothing between reads."""

    async def snapshot(self) -> RedriveSnapshot:
        """Fix where this redrive stops (called once, after :meth:`open`, before any read)."""

    async def read(self, limit: int) -> Sequence[RedriveItem]:
        """At most ``limit`` messages within the snapshot; an empty batch when there are no more."""

    async def renew(self, items: Sequence[RedriveItem]) -> None:
        """Extend the leases of ``items`` by :attr:`lease_seconds` (only called when it is set)."""

    def held_handle(self, item: RedriveItem) -> Any:
        """What of a held message's handle :meth:`renew` and :meth:`release` need (not its content)."""

    async def copy(self, items: Sequence[RedriveItem]) -> Sequence[RedriveItem]:
        """Copy ``items`` to their origin; return those the broker accepted (acknowledged)."""

    async def remove(self, moved: Sequence[RedriveItem], skipped: Sequence[RedriveItem]) -> None:
        """
        Take ``moved`` (accepted copies) out of the dead-letter source.

        ``skipped`` are the batch's messages the filter left: a queue keeps holding them (they are
        given back by :meth:`release`); a log (Kafka) passes them with its committed position.
        """

    async def release(self, items: Sequence[RedriveItem]) -> None:
        """Give back messages that stay in the dead-letter source (skipped, refused, dry run)."""


Checkpoint = Callable[[str, Sequence[RedriveItem]], Awaitable[None]]
"""Called with ``"read"`` and the batch's selected items before their copy, and with ``"copied"``
and the accepted items between the copy and the removal (tests stop or change the world there)."""


@dataclass
class RedriveSummary:
    """What a redrive did (the operator's XCom): counts, and for a dry run a sample of envelopes."""

    broker: str
    source: str
    examined: int = 0
    """Messages of the snapshot read and judged by the filter (each once)."""
    moved: int = 0
    """Copied and removed (a dry run: the ones that would move)."""
    skipped: int = 0
    """Left by the filter: still in the dead-letter source."""
    failed: int = 0
    """Copies the broker refused: still in the dead-letter source."""
    left: int | None = None
    """Of the snapshot, still in the dead-letter source when the redrive ended (skipped, failed,
    and what it did not reach); ``None`` when the broker cannot count and it stopped early."""
    snapshot: int | None = None
    """The snapshot's count (``None``: the broker cannot count without reading)."""
    left_untouched: int = 0
    """Left by the origin rule (another stream's, unknown origin, a truncated copy): never copied."""
    dry_run: bool = False
    samples: list[dict[str, Any]] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {
            "broker": self.broker,
            "source": self.source,
            "examined": self.examined,
            "moved": self.moved,
            "skipped": self.skipped,
            "failed": self.failed,
            "left": self.left,
            "snapshot": self.snapshot,
            "left_untouched": self.left_untouched,
            "dry_run": self.dry_run,
            "samples": self.samples,
        }


def compile_filter(expression: str | None) -> EnvelopeMatcher:
    """The ``filter`` as the triggers' matcher (a ``match`` expression); a bad one raises here."""
    try:
        return EnvelopeMatcher(match=expression)
    except ValueError as exc:
        raise RedriveConfigurationError(str(exc).replace("match", "filter", 1)) from None


def check_max_messages(max_messages: Any) -> int:
    """A positive count; ``None`` is :data:`DEFAULT_MAX_MESSAGES`, never "unbounded"."""
    if max_messages is None:
        return DEFAULT_MAX_MESSAGES
    if isinstance(max_messages, bool) or not isinstance(max_messages, int) or max_messages < 1:
        raise RedriveConfigurationError(
            f"max_messages must be a positive integer or None (the default, {DEFAULT_MAX_MESSAGES}), "
            f"got {max_messages!r}"
        )
    return max_messages


class _Held:
    """What a queue's redrive holds until its end: handles only, leases renewed in the background."""

    def __init__(self, source: DeadLetterSource) -> None:
        self._source = source
        self._slim = source.held_handle
        self.items: dict[str, RedriveItem] = {}
        self._task: asyncio.Task[None] | None = None
        if source.lease_seconds is not None:
            self._task = asyncio.create_task(self._renew_every())

    def keep(self, items: Sequence[RedriveItem]) -> None:
        for item in items:
            item.envelope = {}  # the filter has judged it: keep the handle, not the content
            item.handle = self._slim(item)
            self.items[item.key] = item

    def returning(self, item: RedriveItem) -> bool:
        """Whether ``item`` is one already held (read again): then its newer handle is kept."""
        if item.key not in self.items:
            return False
        self.keep([item])
        return True

    async def _renew_every(self) -> None:
        """At a third of the lease, as the source states it now (Service Bus learns it on a read)."""
        while True:
            await asyncio.sleep((self._source.lease_seconds or 0) / 3)
            held = list(self.items.values())
            if held:
                try:
                    await self._source.renew(held)
                except Exception as exc:  # they come back: recognised by key, never lost
                    log.warning("Renewing %d held message(s) failed: %s", len(held), type(exc).__name__)

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task


async def redrive(
    source: DeadLetterSource,
    *,
    filter: str | None = None,
    max_messages: int | None = None,
    dry_run: bool = False,
    batch_size: int = DEFAULT_BATCH_SIZE,
    sample_size: int = DEFAULT_SAMPLE_SIZE,
    checkpoint: Checkpoint | None = None,
) -> RedriveSummary:
    """
    Move the dead-letter source's messages that ``filter`` selects back to their origin.

    Stops when the source has no more within its snapshot, when the snapshot's count was
    examined, or when ``max_messages`` (:data:`DEFAULT_MAX_MESSAGES` if ``None``) were moved
    (a dry run: selected).
    """
    matcher = compile_filter(filter)
    limit = check_max_messages(max_messages)
    summary = RedriveSummary(broker=source.broker, source=source.label, dry_run=dry_run)
    metrics = StreamMetrics(source.broker, source.label)
    refuse_loop(source)
    held: _Held | None = None
    exhausted = False
    try:
        await source.open()  # inside: a source that half opened is closed too
        refuse_loop(source)  # what only the broker knows (a subscription's topic), now known
        snapshot = await source.snapshot()
        summary.snapshot = snapshot.depth
        log.info("Redrive of %s %s stops at %s", source.broker, source.label, snapshot.bound)
        held = _Held(source)
        returning_reads = 0
        while summary.moved < limit and (snapshot.depth is None or summary.examined < snapshot.depth):
            want = min(batch_size, limit - summary.moved)
            if snapshot.depth is not None:
                want = min(want, snapshot.depth - summary.examined)
            batch = await source.read(want)
            if not batch:
                # A Kafka redrive whose group gave part of the topic to another member did not
                # reach all of its snapshot: what is left there is not known (never 0).
                exhausted = getattr(source, "reached_all", True)
                break
            fresh = [item for item in batch if not held.returning(item)]
            _hold(source, held, [item for item in fresh if item.past_snapshot])
            fresh = [item for item in fresh if not item.past_snapshot]
            if not fresh:  # leases run out despite renewal, or newer than the snapshot: read on, bounded
                returning_reads += 1
                if returning_reads >= RETURNING_READS_LIMIT:
                    log.warning("Redrive of %s reads only messages it already holds: it stops", source.label)
                    break
                continue
            returning_reads = 0
            summary.examined += len(fresh)
            selected: list[RedriveItem] = []
            skipped: list[RedriveItem] = []
            left = [i for i in fresh if i.leave is not None]  # the origin rule: untouched
            note_left(source, left)
            summary.left_untouched += len(left)
            metrics.incr(REDRIVE_LEFT_UNTOUCHED, len(left))
            for item in fresh:
                if item.leave is not None:
                    continue
                verdict, _ = matcher.evaluate(item.envelope)
                (selected if verdict is Verdict.MATCH else skipped).append(item)
            beyond: list[RedriveItem] = []  # read past the maximum: given back, not counted
            room = limit - summary.moved
            if len(selected) > room:
                selected, beyond = selected[:room], selected[room:]
                summary.examined -= len(beyond)
            summary.skipped += len(skipped)
            skipped += left  # from here on passed over like the filter's: held, given back, never copied
            if dry_run:
                summary.moved += len(selected)
                summary.samples.extend(i.envelope for i in selected[: sample_size - len(summary.samples)])
                _hold(source, held, fresh)
                await _release_now(source, fresh)
                continue
            if checkpoint is not None:
                await checkpoint("read", selected)
            accepted = list(await source.copy(selected)) if selected else []
            if checkpoint is not None:
                await checkpoint("copied", accepted)
            await source.remove(accepted, skipped)
            refused = [i for i in selected if all(i is not a for a in accepted)]
            summary.moved += len(accepted)
            summary.failed += len(refused)
            metrics.incr(REDRIVE_MOVED, len(accepted))
            metrics.incr(REDRIVE_FAILED, len(refused))
            _hold(source, held, [*skipped, *beyond, *refused])
            if refused:
                log.warning(
                    "The broker refused %d copy(ies) from %s: they stay there", len(refused), source.label
                )
    finally:
        try:
            if held is not None:
                await held.stop()
                if held.items:
                    await source.release(list(held.items.values()))
        finally:
            metrics.incr(REDRIVE_SKIPPED, summary.skipped)
            metrics.flush()
            await source.close()
    summary.left = _left(summary, exhausted)
    log.info(
        "Redrive of %s %s%s: examined %d, moved %d, skipped by filter %d, failed %d, left %s (snapshot: %s), "
        "of which left untouched by the origin rule %d",
        summary.broker,
        summary.source,
        " (dry run)" if dry_run else "",
        summary.examined,
        summary.moved,
        summary.skipped,
        summary.failed,
        "unknown" if summary.left is None else summary.left,
        "no count" if summary.snapshot is None else summary.snapshot,
        summary.left_untouched,
    )
    return summary


def _hold(source: DeadLetterSource, held: _Held, items: Sequence[RedriveItem]) -> None:
    """A queue holds what stays until the end (each read once); a log has nothing to hold."""
    if source.lease_seconds is not None:
        held.keep(items)


async def _release_now(source: DeadLetterSource, items: Sequence[RedriveItem]) -> None:
    """A log's dry run lets each batch go at once, so memory stays one batch whatever the depth."""
    if source.lease_seconds is None:
        await source.release(items)


def _left(summary: RedriveSummary, exhausted: bool) -> int | None:
    """What of the snapshot is still in the dead-letter source (see :attr:`RedriveSummary.left`)."""
    moved = 0 if summary.dry_run else summary.moved
    stayed = summary.examined - moved
    if summary.snapshot is None:
        return stayed if exhausted else None
    return max(summary.snapshot - moved, stayed)


def note_left(source: DeadLetterSource, left: Sequence[RedriveItem]) -> None:
    """Log what the origin rule left, one line per reason (a shared source may hold thousands)."""
    reasons: dict[str, list[str]] = {}
    for item in left:
        reasons.setdefault(item.leave or "", []).append(item.key)
    for reason, keys in reasons.items():
        log.warning(
            "Left %d message(s) of %s untouched (%s): %s%s",
            len(keys),
            source.label,
            reason,
            ", ".join(keys[:5]),
            ", ..." if len(keys) > 5 else "",
        )
