"""
Dead-letter redrive: move dead-lettered messages back to where they came from, at least once.

One loop for every broker, over a small protocol each broker package implements in its
``redrive.py`` (:class:`DeadLetterSource`): read a batch from the dead-letter source, copy the
selected messages to the origin, and only once the broker has accepted a copy take its original
out of the dead-letter source. A redrive killed at any point leaves every message in the
dead-letter source, at the origin, or in both (a duplicate, which at-least-once allows); never in
neither.

Messages the ``filter`` leaves, and copies the broker refuses, are held until the redrive ends
and then given back (a queue makes them visible again), so one redrive reads each message once.
A dry run holds everything and gives it all back: nothing is copied and nothing removed.

The origin rule: a dead letter goes back only to where it came from. Each broker's source reads
the origin our dead-lettering stamped on it (or the broker's own, where that is unambiguous) and
marks a message it must not move (:attr:`RedriveItem.leave`): from another stream, of an unknown
origin, or a truncated copy that is not the original. Such a message is left untouched, counted
(``left_untouched``) and logged with the reason, never copied anywhere.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from airflow_shared_stream.common.errors import SharedStreamConfigurationError
from airflow_shared_stream.common.matching import EnvelopeMatcher, Verdict
from airflow_shared_stream.common.metrics import StreamMetrics

log = logging.getLogger(__name__)

BROKERS = ("kafka", "sqs", "pubsub", "servicebus")

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

    async def read(self, limit: int) -> Sequence[RedriveItem]:
        """At most ``limit`` messages; an empty batch when the dead-letter source has no more."""

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
    moved: int = 0
    skipped: int = 0
    failed: int = 0
    left_untouched: int = 0
    dry_run: bool = False
    samples: list[dict[str, Any]] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {
            "broker": self.broker,
            "source": self.source,
            "moved": self.moved,
            "skipped": self.skipped,
            "failed": self.failed,
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


def check_max_messages(max_messages: Any) -> int | None:
    if max_messages is None:
        return None
    if isinstance(max_messages, bool) or not isinstance(max_messages, int) or max_messages < 1:
        raise RedriveConfigurationError(
            f"max_messages must be a positive integer or None, got {max_messages!r}"
        )
    return max_messages


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

    Stops when the source has no more, or ``max_messages`` were moved (a dry run: selected).
    """
    matcher = compile_filter(filter)
    limit = check_max_messages(max_messages)
    summary = RedriveSummary(broker=source.broker, source=source.label, dry_run=dry_run)
    metrics = StreamMetrics(source.broker, source.label)
    held: dict[str, RedriveItem] = {}
    refuse_loop(source)
    try:
        await source.open()  # inside: a source that half opened is closed too
        refuse_loop(source)  # what only the broker knows (a subscription's topic), now known
        while limit is None or summary.moved < limit:
            want = batch_size if limit is None else min(batch_size, limit - summary.moved)
            batch = await source.read(want)
            fresh = []
            for item in batch:
                if item.key in held:  # its lease ran out while held: keep the newer handle
                    held[item.key] = item
                else:
                    fresh.append(item)
            if not fresh:
                break
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
            room = None if limit is None else limit - summary.moved
            if room is not None and len(selected) > room:
                selected, beyond = selected[:room], selected[room:]
            summary.skipped += len(skipped)
            skipped += left  # from here on passed over like the filter's: held, given back, never copied
            if dry_run:
                summary.moved += len(selected)
                summary.samples.extend(i.envelope for i in selected[: sample_size - len(summary.samples)])
                held.update((i.key, i) for i in fresh)
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
            held.update((i.key, i) for i in (*skipped, *beyond, *refused))
            if refused:
                log.warning(
                    "The broker refused %d copy(ies) from %s: they stay there", len(refused), source.label
                )
    finally:
        try:
            if held:
                await source.release(list(held.values()))
        finally:
            metrics.incr(REDRIVE_SKIPPED, summary.skipped)
            metrics.flush()
            await source.close()
    log.info(
        "Redrive of %s %s%s: moved %d, skipped by filter %d, failed %d, left untouched %d",
        summary.broker,
        summary.source,
        " (dry run)" if dry_run else "",
        summary.moved,
        summary.skipped,
        summary.failed,
        summary.left_untouched,
    )
    return summary


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
