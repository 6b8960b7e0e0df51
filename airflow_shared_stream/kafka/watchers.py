"""
The watchers a Kafka stream serves in this triggerer process, and how far each one has got.

Why per watcher (docs/ha.rst): Airflow spreads the watchers of one topic over the triggerers, and
each triggerer runs its own consumer. One consumer group per stream would have Kafka split the
partitions between them, so each watcher would see part of the topic. Instead every triggerer
reads every partition and every watcher keeps its own durable position under its own group id
(:mod:`~airflow_shared_stream.kafka.positions`), and resumes from it on whichever triggerer runs it.

How a position stays safe (loss never, duplicates allowed):

* A watcher's filter *joins* the stream's :class:`StreamWatchers` when it starts; the producer
  *admits* it from its read loop: loads its committed offsets, anchors the partitions where it has
  none at the stream's current read position (so a brand-new watcher starts "now", and keeps that
  start if it moves before its first record), seeks a partition back when the watcher is behind,
  and stamps it with ``since_seq``, the sequence number of the next record the producer yields.
  The manager fans every record out synchronously at the yield to every subscriber, and the
  watcher subscribed before its filter started, so it receives every record from ``since_seq`` on.
* On ``advance`` the producer moves a watcher's position over a partition's records one offset at
  a time: only a record at exactly the watcher's position, yielded at or after its ``since_seq``,
  that one of the watcher's own subscribers *finished* (its :class:`Receipt`: the filter came back
  for the next record after it), and settled ACK or DEAD-LETTER (every subscriber it was fanned
  out to has persisted or rejected it) moves it. A record the watcher never received cannot move
  it: the manager stops fanning records out to a subscriber it failed (ack timeout, full queue)
  or that left, while its filter may live on for a while (stuck on a record, or a cancelled
  filter generator that core closes only later), and such a subscriber finishes nothing more.
* A watcher leaves when its filter ends, or as soon as the task running it ends (a cancel: core
  unsubscribes it there, and may close the filter generator only a second later), whichever is
  first; its last position is sent then.
* The filter skips records below its watcher's position: the watcher already passed them,
  maybe in another triggerer. Everything else is evaluated, so after a seek back the other
  watchers of the process may fire again for records still in flight: duplicates, never loss.
* A watcher whose position another triggerer writes with another consumer shape
  (:mod:`~airflow_shared_stream.kafka.marks`) is *refused*: its position is no longer written
  from here, and its filter raises the conflict at its next record, which fails that trigger alone.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import itertools
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Hashable, Sequence
from typing import TYPE_CHECKING, Any

from airflow_shared_stream.common.matching import RawMessage
from airflow_shared_stream.common.process_scope import scoped

if TYPE_CHECKING:
    from airflow_shared_stream.kafka.committer import OffsetCommitter

log = logging.getLogger(__name__)

WATCHER_DIGEST_TAG = "airflow-shared-stream/kafka/watcher"
"""Part of what a watcher's identity hashes: changing it moves every watcher's position."""


def stream_ref(topics: Sequence[str], kafka_config_id: str, group_id: str | None) -> Hashable:
    """The stream a watcher reads and a producer serves (the upstream identity, normalised)."""
    return (tuple(sorted(set(topics))), kafka_config_id, group_id or None)


def watcher_digest(stream: Hashable, match: str | None, reject: str | None) -> str:
    """
    A watcher's durable identity: its stream and what it selects, never its tuning or trigger id.

    Airflow keeps one trigger per distinct ``(classpath, kwargs)`` of an asset watcher, and the
    watchers of one stream agree on every shaping argument (``common/trigger.py``), so within a
    stream the ``match`` and ``reject`` expressions tell watchers apart. The digest survives a
    triggerer restart, a move to another triggerer and a redeploy with other tuning; changing
    what a watcher selects makes it a new watcher, which starts at the stream's read position.
    """
    identity = repr((WATCHER_DIGEST_TAG, stream, match, reject))
    return hashlib.sha256(identity.encode()).hexdigest()[:20]


def watcher_group_id(stream_group: str, digest: str) -> str:
    """The group id that keys one watcher's committed offsets (never joined by anyone)."""
    return f"{stream_group}.watcher-{digest}"


class Receipt:
    """
    Which records one subscriber of a watcher finished: the stream it reads, as its filter sees it.

    The manager fans records out to a subscriber in order, from its subscription until it fails or
    leaves, and its filter pulls them in order; a record is finished when the filter comes back for
    the next one (where the manager closes the record's window), so the subscriber finished exactly
    the sequence numbers from ``first`` to ``finished``. ``__anext__`` hands the manager's awaitable
    on, so this adds no generator layer to the hot path.
    """

    __slots__ = ("_next", "finished", "first", "pulled")

    def __init__(self, stream: AsyncIterator[Any]) -> None:
        self._next = stream.__aiter__().__anext__
        self.first = -1
        """Sequence number of the first record the subscriber pulled (-1: none yet)."""
        self.pulled = -1
        self.finished = -1

    def __aiter__(self) -> Receipt:
        return self

    def __anext__(self) -> Awaitable[Any]:
        self.finished = self.pulled
        return self._next()

    def took(self, seq: int) -> None:
        """The filter pulled the record yielded as ``seq``."""
        if self.first < 0:
            self.first = seq
        self.pulled = seq

    def covers(self, seq: int) -> bool:
        return self.first <= seq <= self.finished and seq >= 0


class WatcherCursor:
    """One watcher's position in this process (see the module docstring)."""

    __slots__ = ("committer", "conflict", "digest", "group", "label", "next", "receipts", "refs", "since_seq")

    def __init__(self, digest: str, label: str) -> None:
        self.digest = digest
        self.label = label
        self.refs = 0
        self.group: str | None = None
        self.next: dict[Any, int] = {}
        """(topic, partition) -> the watcher's next offset: everything below is done for it."""
        self.since_seq: int | None = None
        """First producer sequence number this watcher surely received; ``None`` until admitted."""
        self.committer: OffsetCommitter | None = None
        self.conflict: Exception | None = None
        """Why the watcher was refused (see :meth:`refuse`); its filter raises it."""
        self.receipts: list[Receipt] = []
        """What each of the watcher's subscribers in this process finished (one, but for a move)."""

    def finished(self, seq: int) -> bool:
        """Whether one of the watcher's subscribers here finished the record yielded as ``seq``."""
        return any(receipt.covers(seq) for receipt in self.receipts)

    def passed(self, message: RawMessage) -> bool:
        """Whether the watcher already passed this record (the filter skips it): hot path."""
        if self.conflict is not None:
            raise self.conflict
        if not self.next:
            return False
        envelope = message.envelope
        position = self.next.get((envelope["topic"], envelope["partition"]))
        return position is not None and envelope["offset"] < position

    def refuse(self, conflict: Exception) -> None:
        """
        Stop writing this watcher's position from here, now, and fail its filter with ``conflict``.

        Nothing pending is sent: the position is someone else's to write while the conflict lasts.
        """
        log.error("%s", conflict)
        self.conflict = conflict
        committer, self.committer = self.committer, None
        if committer is not None:
            committer.abandon()

    def reset(self) -> None:
        """Forget what the last producer loaded: the next producer admits the watcher afresh."""
        self.next = {}
        self.since_seq = None
        self.committer = None


SEQ_SPACE = 1 << 48
"""Sequence numbers each producer of a stream has for itself (see :meth:`StreamWatchers.first_seq`)."""


class StreamWatchers:
    """The watchers of one stream in this process: the meeting point of filters and producer."""

    def __init__(self) -> None:
        self._seq_spaces = itertools.count()
        self.cursors: dict[str, WatcherCursor] = {}
        self.pending: list[WatcherCursor] = []
        """Joined, not yet admitted by the producer."""
        self._closing: set[asyncio.Task[None]] = set()
        self.carriers: dict[int, tuple[str, Any]] = {}
        """Trigger id -> (stream identity digest, its asset's state store) of each watcher here
        that has one: where the stream's memory of its topic ids is kept (:mod:`.topic_memory`)."""
        self.before_leave: Callable[[], None] | None = None
        """The producer's fold of the ACKs it keeps for its committer's round: called before a
        watcher's last position is sent, so that position covers everything it persisted."""

    def first_seq(self) -> int:
        """
        Where a new producer of the stream starts its sequence numbers: after every earlier one's.

        A subscriber of a producer that went away can outlive it (stuck on a record), and its
        receipt names that producer's numbers: they must never name another producer's records.
        """
        return next(self._seq_spaces) * SEQ_SPACE

    def join(self, digest: str, label: str, receipt: Receipt | None = None) -> WatcherCursor:
        cursor = self.cursors.get(digest)
        if cursor is None:
            cursor = self.cursors[digest] = WatcherCursor(digest, label)
            self.pending.append(cursor)
        cursor.refs += 1
        if receipt is not None:
            cursor.receipts.append(receipt)
        return cursor

    def leave(self, cursor: WatcherCursor, receipt: Receipt | None = None) -> None:
        """
        The watcher's filter ended: send its last position (in the background) and drop it.

        What the subscriber finished and had persisted is folded in first, while its receipt
        still counts: the last position covers it.
        """
        cursor.refs -= 1
        if cursor.refs <= 0 and cursor.committer is not None and self.before_leave is not None:
            self.before_leave()
        if receipt is not None:
            with contextlib.suppress(ValueError):
                cursor.receipts.remove(receipt)
        if cursor.refs > 0:
            return
        self.cursors.pop(cursor.digest, None)
        with contextlib.suppress(ValueError):
            self.pending.remove(cursor)
        committer = cursor.committer
        cursor.reset()
        if committer is not None:
            committer.refresh()  # the whole position, so its last mark says the watcher left
            task = asyncio.get_running_loop().create_task(committer.stop())
            self._closing.add(task)
            task.add_done_callback(self._closing.discard)

    async def closed(self) -> None:
        """Wait for the final position sends of the watchers that left."""
        while self._closing:
            await asyncio.gather(*self._closing, return_exceptions=True)

    def take_pending(self) -> list[WatcherCursor]:
        pending, self.pending = self.pending, []
        return pending

    def admitted(self) -> list[WatcherCursor]:
        """The watchers the producer serves: loaded, and not refused."""
        return [c for c in self.cursors.values() if c.since_seq is not None and c.conflict is None]

    def readmit_all(self) -> None:
        """The producer went away: every watcher still here is admitted again by the next one."""
        for cursor in self.cursors.values():
            cursor.reset()
            if cursor not in self.pending:
                self.pending.append(cursor)


def watchers_of(stream: Hashable) -> StreamWatchers:
    """
    The triggerer's registry entry of ``stream`` (one event loop: no locking needed).

    Per triggerer process (:mod:`~airflow_shared_stream.common.process_scope`), so the test
    harness can play two triggerers in one process.
    """
    streams: dict[Hashable, StreamWatchers] = scoped("kafka.stream_watchers", dict)
    entry = streams.get(stream)
    if entry is None:
        entry = streams[stream] = StreamWatchers()
    return entry
