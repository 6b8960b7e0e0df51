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
from typing import NamedTuple

from aiokafka import AIOKafkaConsumer, TopicPartition

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
