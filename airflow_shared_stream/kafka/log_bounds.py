"""
Where each partition's log starts and ends, and where a position the log no longer holds goes.

A committed position is only an offset. Retention (or DeleteRecords) can delete past it: reading
there makes the client reset to ``auto.offset.reset``, and with ``latest`` skip every record
retention kept, at every start, since the position never moves again. A topic deleted and
created again numbers its records from 0 again: an old position points into or past the new log,
and reading from it skips the new log's first records. Both are placed here before any read, and
said at WARNING: below the log start, at the log start (naming the offsets retention took); on a
new topic (a new topic id or, where the broker has no topic ids, a log that ends below the
position), at its start.

A partition with no position while its topic's other partitions have one was added since the
stream last ran: it is read from its start too (``auto.offset.reset`` is for a new stream, and
``latest`` would skip what was produced to it meanwhile).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.errors import KafkaError, NoOffsetForPartitionError, OffsetOutOfRangeError

if TYPE_CHECKING:
    from airflow_shared_stream.kafka.producer import KafkaSharedStreamProducer

log = logging.getLogger(__name__)


class LogBounds(NamedTuple):
    """The first offset a partition's log holds and the offset its next record gets."""

    start: int
    end: int


async def read_log_bounds(
    consumer: AIOKafkaConsumer, lanes: Sequence[TopicPartition]
) -> dict[TopicPartition, LogBounds]:
    """The bounds of every lane's log, as the broker says now (two requests)."""
    if not lanes:
        return {}
    starts = await consumer.beginning_offsets(list(lanes))
    ends = await consumer.end_offsets(list(lanes))
    return {tp: LogBounds(starts[tp], ends[tp]) for tp in lanes if tp in starts and tp in ends}


FETCHED_END_ROUNDS = 50
"""Reads tried for a partition's end before giving up (an empty partition's fetch waits on the broker)."""
FETCHED_END_WAIT_MS = 200


async def fetched_log_ends(
    consumer_kwargs: Mapping[str, Any], lanes: Sequence[TopicPartition]
) -> dict[TopicPartition, int]:
    """
    Each lane's end as a fetch answers it now: the high watermark, or under ``read_committed``
    the last stable offset (what ListOffsets' latest means in Kafka, and what a consumer may read).

    ListOffsets is not asked: Tansu 0.6.0 answers it with the first offset of the partition's last
    batch plus one (its fetches carry the right high watermark). A throwaway consumer of no group
    fetches from there and reads the marks off the answer; its records are dropped.
    """
    if not lanes:
        return {}
    kwargs = {**consumer_kwargs, "group_id": None, "enable_auto_commit": False}
    committed_only = kwargs.get("isolation_level") == "read_committed"
    probe = AIOKafkaConsumer(**kwargs)
    await probe.start()
    try:
        probe.assign(list(lanes))
        # From the last record it reports (still in the log), so the answer comes at once with it.
        for tp, bounds in (await read_log_bounds(probe, lanes)).items():
            probe.seek(tp, max(bounds.start, bounds.end - 1))
        ends: dict[TopicPartition, int] = {}
        for _ in range(FETCHED_END_ROUNDS):
            missing = [tp for tp in lanes if tp not in ends]
            if not missing:
                return ends
            await probe.getmany(*missing, timeout_ms=FETCHED_END_WAIT_MS, max_records=1)
            for tp in missing:
                highwater = probe.highwater(tp)  # None until a fetch of the lane was answered
                if highwater is not None:
                    stable = probe.last_stable_offset(tp)  # None from brokers older than Fetch v4
                    ends[tp] = stable if committed_only and stable is not None else highwater
        raise KafkaError(f"no fetch answered with the end of {sorted(set(lanes) - set(ends))}")
    finally:
        await probe.stop()


def place(
    tp: TopicPartition,
    position: int,
    bounds: LogBounds | None,
    *,
    whose: str,
    end_shows_new_topics: bool = True,
) -> int:
    """
    Where ``whose`` position ``position`` on ``tp`` reads from: itself while the log holds it.

    ``end_shows_new_topics``: whether a log ending below the position means a new topic; only
    where the broker has no topic ids (one that has them may report its log end late: Tansu).
    """
    if bounds is None:
        return position
    if end_shows_new_topics and position > bounds.end:
        log.warning(
            "Kafka %s/%d is a new log (the topic was deleted and created again, or truncated): "
            "%s reads it from its start %d, not from its old position %d",
            tp.topic,
            tp.partition,
            whose,
            bounds.start,
            position,
        )
        return bounds.start
    if position < bounds.start:
        log.warning(
            "Kafka %s/%d: retention deleted offsets %d-%d before %s read them (lost); "
            "reading from the log start %d",
            tp.topic,
            tp.partition,
            position,
            bounds.start - 1,
            whose,
            bounds.start,
        )
        return bounds.start
    return position


def place_all(
    found: dict[TopicPartition, int],
    bounds: Mapping[TopicPartition, LogBounds],
    *,
    whose: str,
    end_shows_new_topics: bool = True,
) -> dict[TopicPartition, int]:
    """:func:`place` every position of ``found``, in place; returns those that moved."""
    moved: dict[TopicPartition, int] = {}
    for tp, position in found.items():
        start = place(
            tp,
            position,
            bounds.get(tp),
            whose=whose,
            end_shows_new_topics=end_shows_new_topics,
        )
        if start != position:
            moved[tp] = start
    found.update(moved)
    return moved


async def place_stream_starts(
    consumer: AIOKafkaConsumer,
    committed: Mapping[TopicPartition, int],
    lanes: Sequence[TopicPartition],
    *,
    whose: str,
    seek: Callable[[TopicPartition, int], None],
    commit: Callable[[dict[TopicPartition, int]], Awaitable[object]],
    end_shows_new_topics: bool = True,
) -> None:
    """
    Seek every lane of a starting stream to where it reads from, and commit what moved.

    ``committed``: the stream group's positions. A lane without one reads from its start when its
    topic's other lanes have one (a partition added since the last run); a lane of a topic with no
    position at all is left to ``auto.offset.reset``.
    """
    bounds = await read_log_bounds(consumer, lanes)
    known_topics = {tp.topic for tp in committed}
    moved: dict[TopicPartition, int] = {}
    for tp in lanes:
        position = committed.get(tp)
        if position is not None:
            start = place(
                tp,
                position,
                bounds.get(tp),
                whose=whose,
                end_shows_new_topics=end_shows_new_topics,
            )
        elif tp.topic in known_topics and tp in bounds:
            start = bounds[tp].start
            log.warning(
                "Kafka %s/%d was added since %s last ran: reading it from its start %d",
                tp.topic,
                tp.partition,
                whose,
                start,
            )
        else:
            continue
        seek(tp, start)
        if start != position:
            moved[tp] = start
    if moved:
        await commit(moved)


async def place_off_the_log(
    stream: KafkaSharedStreamProducer,
    consumer: AIOKafkaConsumer,
    exc: OffsetOutOfRangeError | NoOffsetForPartitionError,
) -> None:
    """
    Place a lane whose position the log does not hold (the client no longer resets it).

    Below the log start (retention or DeleteRecords passed the read position while the stream
    ran, or a seek back landed there): the lane, its held floor, the stream's commit and every
    watcher below it move to the log start, said at WARNING. Not below the log start on a broker
    without topic ids: the fetch found the log ending below the position (a producer may have
    written past it since, before the bounds were read here), so a topic created again, read from
    its start by the cluster check, now.
    Anything else (past the log end where topic ids show new topics, or a lane with no
    position at all) goes where ``auto.offset.reset`` points, as the client did.
    """
    found = exc.args[0] if exc.args else None
    if isinstance(exc, OffsetOutOfRangeError):
        offsets: dict[TopicPartition, int | None] = dict(found) if isinstance(found, dict) else {}
    else:
        offsets = {found: None} if isinstance(found, TopicPartition) else {}
    assigned = consumer.assignment()
    lanes = [tp for tp in offsets if tp in assigned]
    bounds = await read_log_bounds(consumer, lanes)  # a KafkaError is the stream's to name
    for tp in lanes:
        offset, edges = offsets[tp], bounds.get(tp)
        if edges is None:
            continue  # the next fetch asks again
        if offset is not None and offset < edges.start:
            start = place(tp, offset, edges, whose=f"the stream (group {stream.group_id!r})")
            stream.ledger.skip_to((tp.topic, tp.partition), start)
            stream.committer.queue(tp, start)
            stream.positions.skip_to(tp, start)
        elif offset is not None and not stream.cluster.has_topic_ids:
            # Not below the log start, so the log ended below the position when the fetch was
            # answered (its end now may be past it: records written since), on a broker without
            # topic ids: a new log. The check that follows now reads it from its start, for every
            # watcher too.
            start = edges.start
            stream.cluster.suspect_new_log(tp.topic)
        else:
            start = edges.start if stream._offset_reset == "earliest" else edges.end
            log.info(
                "Kafka %s/%d: position %s is not in the log %d-%d: reading from %d (auto.offset.reset=%s)",
                tp.topic,
                tp.partition,
                offset,
                edges.start,
                edges.end,
                start,
                stream._offset_reset,
            )
        stream._rewind(tp, start)
