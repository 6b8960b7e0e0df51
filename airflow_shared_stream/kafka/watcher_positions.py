"""
The producer's half of the watchers' own positions: admit, move, mark and refresh them.

The rules are :mod:`~airflow_shared_stream.kafka.watchers`'s; the marks each commit carries are
:mod:`~airflow_shared_stream.kafka.marks`'s. This is where the producer's read loop, its folds and
its refresh task apply them, through the stream consumer's own client
(:class:`~airflow_shared_stream.kafka.positions.PositionStore`).

The new logs the stream saw (a topic created again, a partition added), the watchers away from
each (:attr:`WatcherPositions.new_logs`) and the watchers it served outlive the process: the
stream's memory (:mod:`~airflow_shared_stream.kafka.topic_memory`) keeps them, is told of every
change (:attr:`WatcherPositions.on_new_logs`, :attr:`WatcherPositions.on_served`), and gives them
back to the next start (:meth:`WatcherPositions.recall`). A watcher a restart admitted before that
answer came is put back at the new log's start (duplicates, never a skip). A watcher new to the
stream starts at the read position even while others are away from a new log.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.errors import KafkaError, OffsetMetadataTooLargeError

from airflow_shared_stream.common.errors import StreamShapeConflictError
from airflow_shared_stream.kafka.commit_guard import CommitGuard
from airflow_shared_stream.kafka.committer import OffsetCommitter
from airflow_shared_stream.kafka.envelope import KafkaBrokerPayload
from airflow_shared_stream.kafka.errors import KafkaSharedStreamError
from airflow_shared_stream.kafka.log_bounds import place_all, read_log_bounds
from airflow_shared_stream.kafka.marks import LIVE_FOR, PositionMark, disagreements, newest_mark
from airflow_shared_stream.kafka.positions import Committed, PositionStore
from airflow_shared_stream.kafka.watchers import StreamWatchers, WatcherCursor, watcher_group_id

log = logging.getLogger(__name__)


class WatcherPositions:
    """
    The positions of one stream's watchers in this triggerer, as its producer keeps them.

    :param watchers: the stream's registry (the filters join and leave it).
    :param topics: the stream's topics (for messages).
    :param shape: the consumer's shaping arguments, as the trigger normalises them: what marks
        every commit of a position.
    :param describe_error: turns a client error into the stream's error (scrubbed of secrets).
    """

    def __init__(
        self,
        watchers: StreamWatchers,
        *,
        topics: Sequence[str],
        shape: dict[str, Any],
        describe_error: Callable[[str, BaseException], KafkaSharedStreamError],
    ) -> None:
        self.watchers = watchers
        self.topics = list(topics)
        self.shape = shape
        self._error = describe_error
        self.store: PositionStore | None = None
        self.stream_group: str | None = None
        self.lanes: list[TopicPartition] = []
        self.closing = False
        """Set when the stream stops: its last marks say its watchers no longer run here."""
        self.end_shows_new_topics = True
        """Whether a log ending below a position means a new topic (a broker without topic ids)."""
        self.served: set[str] = set()
        """The position groups of every watcher this stream admitted (and, from its memory, the
        ones earlier runs of it admitted)."""
        self.on_served: Callable[[str], None] = lambda group: None
        """Called with each group admitted: the stream's memory keeps them (:mod:`.topic_memory`)."""
        self.new_logs: dict[TopicPartition, tuple[int, frozenset[str]]] = {}
        """Lanes this stream saw added or created again: the start of each new log, and the
        watchers it had served that were away then (see :meth:`_with_new_logs`)."""
        self.on_new_logs: Callable[[], None] = lambda: None
        """Called when :attr:`new_logs` changed: the stream's memory keeps them (:mod:`.topic_memory`)."""
        self.recalled: dict[TopicPartition, tuple[int, frozenset[str]]] = {}
        """New logs the memory named after watchers away from them were admitted: put back at the
        next pass (:meth:`recall`)."""
        self._marking = True
        self.guard: CommitGuard | None = None
        """Filters every commit of a position (:mod:`.commit_guard`)."""

    def bind(self, store: PositionStore, stream_group: str, lanes: list[TopicPartition]) -> None:
        """Read and write through ``store``, for the watchers of ``stream_group`` on ``lanes``."""
        self.store, self.stream_group, self.lanes = store, stream_group, lanes

    async def admit(
        self,
        consumer: AIOKafkaConsumer,
        seek: Callable[[TopicPartition, int], None],
        next_seq: int,
        *,
        starting: bool = False,
    ) -> None:
        """
        Load the position of every watcher that joined since the last pass (see :mod:`.watchers`).

        A partition the watcher has a position on starts (or seeks back) there when the consumer
        is past it; a partition it has none on is anchored at the consumer's read position, which
        on a fresh stream is the stream group's commit or ``auto.offset.reset``. When the stream
        starts (``starting``) and every watcher has a position on a partition, the partition starts
        at the lowest of them, forward too. Runs between fetches, in the task that yields, so
        ``next_seq`` (the sequence number of the next record yielded) is exact. A watcher whose
        position a live consumer of another shape writes is refused instead (:mod:`.marks`).
        """
        if self.recalled:
            await self._put_back(consumer, seek, next_seq)
        pending = [cursor for cursor in self.watchers.take_pending() if cursor.conflict is None]
        store, stream_group = self.store, self.stream_group
        if not pending or store is None or stream_group is None:
            self.watchers.pending[:0] = pending
            return
        loaded: list[tuple[WatcherCursor, str, dict[TopicPartition, int]]] = []
        known_away: dict[str, dict[TopicPartition, frozenset[str]]] = {}
        for cursor in pending:
            group = cursor.group = watcher_group_id(stream_group, cursor.digest)
            try:
                committed = await store.fetch(group, self.lanes)
            except KafkaError as exc:
                self.watchers.pending[:0] = pending
                raise self._error(f"reading the position of watcher {cursor.label}", exc) from None
            if not self._refused(cursor, committed):
                loaded.append((cursor, group, self._with_new_logs(cursor, committed.offsets)))
                known_away[group] = {tp: away for tp, (_, away) in self.new_logs.items()}
        # A position the log no longer holds (retention, a new topic) reads from the log start.
        try:
            bounds = await read_log_bounds(consumer, self.lanes) if loaded else {}
        except KafkaError as exc:
            self.watchers.pending[:0] = pending
            raise self._error("reading where the partitions' logs start", exc) from None
        moved = {
            group: place_all(
                found,
                bounds,
                whose=f"watcher {cursor.label}",
                end_shows_new_topics=self.end_shows_new_topics,
            )
            for cursor, group, found in loaded
        }
        # Start (or seek back) each partition at the lowest position among the joiners.
        for tp in self.lanes:
            wanted = [found[tp] for _, _, found in loaded if tp in found]
            if not wanted:
                continue
            lowest = min(wanted)
            if (starting and len(wanted) == len(loaded)) or lowest < await consumer.position(tp):
                seek(tp, lowest)
                log.info("Kafka %s/%d: reading from %d, its watchers' lowest", tp.topic, tp.partition, lowest)
        for cursor, group, found in loaded:
            anchors: dict[TopicPartition, int] = dict(moved[group])
            anchors.update({tp: found[tp] for tp in self.new_logs if tp in found and tp not in anchors})
            self.served.add(group)
            self.on_served(group)
            for tp in self.lanes:
                if tp in found:
                    cursor.next[tp] = found[tp]
                else:
                    cursor.next[tp] = anchors[tp] = await consumer.position(tp)
            try:
                await self._write(cursor, group, anchors)
            except KafkaError as exc:
                raise self._error(f"anchoring the position of watcher {cursor.label}", exc) from None
            if not self._named_away_meanwhile(cursor, group, known_away[group]):
                self._no_longer_away(group)
            committer = OffsetCommitter(
                commit=functools.partial(self._write, cursor, group),
                describe_error=self._error,
            )
            committer.seed(cursor.next)
            committer.start()
            cursor.committer = committer
            cursor.since_seq = next_seq
            log.info(
                "Kafka watcher %s joined %s at %s (group %r)",
                cursor.label,
                ",".join(self.topics),
                ", ".join(f"{tp.partition}@{cursor.next[tp]}" for tp in self.lanes),
                cursor.group,
            )

    def _with_new_logs(
        self, cursor: WatcherCursor, found: dict[TopicPartition, int]
    ) -> dict[TopicPartition, int]:
        """
        ``found`` with the start of every new log this stream saw where the joiner has no position.

        Kafka deletes a deleted topic's committed offsets, so a watcher paused while its topic was
        created again (or a partition added) comes back with no position there, like a new one.
        Anchored at the read position, it would skip what the new log received while it was away:
        a watcher this stream served before and that was away then reads the new log from its
        start instead. A watcher new to the stream starts at the read position, as anywhere.

        A position the joiner has there above the new log's start is taken for its last position
        on the old log, still in flight when the topic was created again (the commit guard read
        the old id; the request landed on the new topic): it reads the new log from its start too
        (duplicates at worst, of what another triggerer fired for it meanwhile; never a skip).
        """
        for tp, (start, away) in self.new_logs.items():
            if cursor.group not in away or tp not in self.lanes:
                continue
            stale = found.get(tp)
            if stale is not None and stale <= start:
                continue
            found[tp] = start
            log.warning(
                "Kafka %s/%d is a new log since watcher %s last had a position there (the "
                "topic was created again or the partition added): it reads it from its start %d%s",
                tp.topic,
                tp.partition,
                cursor.label,
                start,
                "" if stale is None else f" (its position {stale} there was of the old log, sent late)",
            )
        return found

    def _named_away_meanwhile(
        self, cursor: WatcherCursor, group: str, known: dict[TopicPartition, frozenset[str]]
    ) -> bool:
        """
        Whether the memory named ``group`` away from a new log during its admission (its answer
        came after :meth:`_with_new_logs` read :attr:`new_logs`, while the admission awaited the
        broker): not admitted yet, :meth:`recall` did not put it back; it is put back at the next
        pass (:meth:`_put_back`), and stays away until then.
        """
        late = False
        for tp, (start, away) in self.new_logs.items():
            position = cursor.next.get(tp)
            if group in away and group not in known.get(tp, ()) and position is not None and position > start:
                _, named = self.recalled.get(tp, (start, frozenset()))
                self.recalled[tp] = (start, named | {group})
                late = True
        return late

    def _no_longer_away(self, group: str) -> None:
        """
        ``group`` has a position on every new log now: it was not away from them any more.

        Kept away, a watcher whose position later expires (``offsets.retention.minutes``, while it
        runs nowhere) would read the new log again from its start, firing again for every record
        it had fired for. A new log no watcher is away from is forgotten (by the memory too).
        """
        for tp, (start, away) in list(self.new_logs.items()):
            if group in away:
                if len(away) == 1:
                    del self.new_logs[tp]
                else:
                    self.new_logs[tp] = (start, away - {group})
                self.on_new_logs()

    def recall(self, tp: TopicPartition, start: int, away: frozenset[str]) -> None:
        """
        A new log an earlier run of the stream saw, and the watchers away from it then (its memory).

        A watcher not admitted yet reads it from its start when admitted (:meth:`_with_new_logs`);
        one admitted already (the memory answered after the start) is put back at its start at the
        next pass (:meth:`admit`): it resumed at a position that skips the new log's first records.
        """
        if tp not in self.lanes:
            return
        known_start, known_away = self.new_logs.get(tp, (start, frozenset()))
        if known_start != start:
            return  # this run followed a later new log there already
        self.new_logs[tp] = (start, known_away | away)
        admitted = {cursor.group for cursor in self.watchers.admitted()} & away
        if admitted:
            self.recalled[tp] = (start, frozenset(group for group in admitted if group is not None))

    async def _put_back(
        self, consumer: AIOKafkaConsumer, seek: Callable[[TopicPartition, int], None], next_seq: int
    ) -> None:
        """Move admitted watchers the memory names as away back to the new log's start (:meth:`recall`)."""
        recalled, self.recalled = self.recalled, {}
        for tp, (start, away) in recalled.items():
            for cursor in self.watchers.admitted():
                named, position = cursor.group, cursor.next.get(tp)
                if named is None or named not in away or position is None or tp not in self.lanes:
                    continue
                if position > start:
                    log.warning(
                        "Kafka %s/%d is a new log since watcher %s last had a position there (the "
                        "stream's memory says so, read after the watcher resumed at %d): it reads it "
                        "again from its start %d",
                        tp.topic,
                        tp.partition,
                        cursor.label,
                        position,
                        start,
                    )
                    cursor.next[tp] = start
                    cursor.since_seq = next_seq
                    if start < await consumer.position(tp):
                        seek(tp, start)
                    try:
                        await self._write(cursor, named, {tp: start})
                    except KafkaError as exc:
                        raise self._error(f"placing the position of watcher {cursor.label}", exc) from None
                    if cursor.committer is not None:
                        cursor.committer.queue(tp, start)
                self._no_longer_away(named)

    def restart_lanes(self, starts: dict[TopicPartition, int]) -> None:
        """Every admitted watcher reads these lanes from these offsets (new partitions, new logs)."""
        here = {cursor.group for cursor in self.watchers.admitted()}
        for tp, start in starts.items():
            _, away_before = self.new_logs.get(tp, (start, frozenset()))
            self.new_logs[tp] = (start, away_before | (self.served - here))
            self.recalled.pop(tp, None)  # every watcher here reads it from its start now
        if starts:
            self.on_new_logs()
        for cursor in self.watchers.admitted():
            for tp, start in starts.items():
                cursor.next[tp] = start
                if cursor.committer is not None:
                    cursor.committer.queue(tp, start)

    def skip_to(self, tp: TopicPartition, start: int) -> None:
        """Every admitted watcher whose position on ``tp`` is below ``start`` moves to it (retention)."""
        for cursor in self.watchers.admitted():
            position = cursor.next.get(tp)
            if position is None or position >= start:
                continue
            log.warning(
                "Kafka %s/%d: retention deleted offsets %d-%d before watcher %s read them (lost); "
                "reading from the log start %d",
                tp.topic,
                tp.partition,
                position,
                start - 1,
                cursor.label,
                start,
            )
            cursor.next[tp] = start
            if cursor.committer is not None:
                cursor.committer.queue(tp, start)

    def advance(self, tp: TopicPartition, settled: list[KafkaBrokerPayload]) -> None:
        """
        Move every admitted watcher's position over the records ``settled`` terminally, in
        fan-out order: only a record at exactly the watcher's position that one of its
        subscribers finished (a watcher the manager failed or let go finishes nothing more).
        """
        for cursor in self.watchers.admitted():
            committer = cursor.committer
            if committer is not None and committer.error is not None:
                raise committer.error
            position = start = cursor.next.get(tp)
            if position is None:
                continue
            since = cursor.since_seq or 0
            for payload in settled:
                if payload.offset == position and payload.seq >= since:
                    # Not finished: the manager failed or let go of its subscribers meanwhile.
                    position += 1 if cursor.finished(payload.seq) else 0
            if position != start and committer is not None:
                cursor.next[tp] = position
                committer.queue(tp, position)

    async def refresh(self) -> None:
        """
        Commit every admitted watcher's position again, unchanged, after reading it.

        The read finds a consumer of another shape on another triggerer that started writing the
        position since this one was admitted (both admitted at the same moment, say).
        """
        store = self.store
        for cursor in self.watchers.admitted():
            committer = cursor.committer
            if store is None or committer is None or cursor.group is None:
                continue
            try:
                committed = await store.fetch(cursor.group, self.lanes)
            except KafkaError as exc:  # the next round tries again; a lasting fault fails commits
                log.warning("Reading the position of watcher %s failed: %s", cursor.label, type(exc).__name__)
                continue
            if not self._refused(cursor, committed):
                committer.refresh()

    async def stop(self) -> None:
        """Send every position still here, marked as stopped (the producer closes)."""
        self.closing = True
        # The last position sends of the watchers that left (in the background), then the rest.
        await self.watchers.closed()
        for cursor in self.watchers.admitted():
            if cursor.committer is not None:
                cursor.committer.refresh()  # the whole position, so its last mark says it stopped
                await cursor.committer.stop()
        self.watchers.readmit_all()

    # -- marks ----------------------------------------------------------------------------

    def _mark(self, cursor: WatcherCursor) -> str:
        """What a commit of ``cursor``'s position says: this shape, now, and whether it still runs."""
        if not self._marking:
            return ""
        live = cursor.refs > 0 and not self.closing  # a watcher that left, or a stream that stops
        return PositionMark(self.shape, time.time(), live).encode()

    async def _write(self, cursor: WatcherCursor, group: str, offsets: dict[TopicPartition, int]) -> None:
        """Commit ``offsets`` as ``cursor``'s position, with its mark while the cluster takes one."""
        store, guard = self.store, self.guard
        if store is None:
            return
        if guard is not None:
            offsets = await guard.admit(offsets)
        try:  # a coordinator loading or moved is asked again, never the stream's failure
            await store.commit_asking_again(group, offsets, self._mark(cursor))
        except OffsetMetadataTooLargeError:
            if not self._marking:
                raise
            # A cluster whose offset.metadata.max.bytes is below a mark: positions still count
            # more than detecting a watcher of another shape elsewhere, so go on without marks.
            self._marking = False
            log.warning(
                "The Kafka cluster refuses the mark a position's commit carries "
                "(offset.metadata.max.bytes): positions of %s are committed without it, so "
                "watchers that differ only in a shaping argument are not detected across triggerers",
                ",".join(self.topics),
            )
            await store.commit_asking_again(group, offsets)
        if guard is not None:
            guard.committed(offsets)

    def _refused(self, cursor: WatcherCursor, committed: Committed) -> bool:
        """Refuse ``cursor`` if a live consumer of another shape writes its position (:mod:`.marks`)."""
        conflicts = disagreements(self.shape, newest_mark(committed.metadata.values()), time.time())
        if not conflicts:
            return False
        cursor.refuse(
            StreamShapeConflictError(
                f"Kafka watcher {cursor.label} of {','.join(self.topics)} (position {cursor.group!r}) "
                f"runs on another triggerer with {', '.join(conflicts)}. Watchers that differ only in "
                "dead_letter_topic, max_in_flight or max_payload_bytes share one position, so one "
                "would commit past records the other never persisted: give them the same values. "
                "This watcher fails until the other stops (a triggerer that died counts as running "
                f"for {LIVE_FOR:.0f} s after its last commit)."
            )
        )
        return True
