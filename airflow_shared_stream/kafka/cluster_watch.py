"""
Partitions added and topics created again while a stream runs.

The stream assigns itself every partition of its topics when it starts. A partition added later
would be read by no one until a restart, and then from ``auto.offset.reset`` (``latest``: its
records so far skipped). A topic deleted and created again numbers its records from 0 again,
while the consumer keeps reading at its old position: the new topic's first records are skipped,
with no error. :class:`ClusterWatch` checks for both every ``interval``, between fetches, at the
cost of one Metadata request (and one ListOffsets request without topic ids), and
:meth:`ClusterWatch.follow` reads what is new from its start.

A topic is taken for created again when its topic id changed, or when it was seen missing
(deleted) by an earlier check. A broker without topic ids (noida-db) has a third sign, a log that
ends below the consumer's position; it is not used where there are ids, since a broker may report
its log end late (Tansu 0.6.0 reported log ends below offsets it had already served). Without
ids, a topic deleted, created and filled past the old position between two checks is not seen.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, NamedTuple

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.errors import KafkaError

from airflow_shared_stream.kafka.log_bounds import read_log_bounds
from airflow_shared_stream.kafka.topic_ids import TopicShape, read_topic_shapes

if TYPE_CHECKING:
    from airflow_shared_stream.kafka.producer import KafkaSharedStreamProducer

log = logging.getLogger(__name__)

CLUSTER_CHECK_INTERVAL = 5.0
"""Seconds between two checks of the stream's topics (two small requests each)."""


class ClusterChanges(NamedTuple):
    added: list[TopicPartition]
    """Partitions that exist now and are not read yet."""
    renewed: set[str]
    """Topics deleted and created again since the last check."""


class ClusterWatch:
    """What the stream's topics looked like at the last check, and the next check's time."""

    def __init__(self, topics: Sequence[str], interval: float | None = None) -> None:
        self.topics = list(topics)
        self.interval = CLUSTER_CHECK_INTERVAL if interval is None else interval
        self.shapes: dict[str, TopicShape] = {}
        self.gone: set[str] = set()
        self.following: set[str] = set()
        """Topics created again that :meth:`follow` is reading from their start now (not committed)."""
        self._next_check = time.monotonic() + self.interval

    def due(self) -> bool:
        return time.monotonic() >= self._next_check

    def suspect_new_log(self, topic: str) -> None:
        """
        A fetch found ``topic``'s log ending below a read position, on a broker without topic ids:
        take the topic for created again at the next check, which is now. Without this, the
        client's answer to the fetch (a position at the new log's end) hides the sign from it.
        """
        self.gone.add(topic)
        self._next_check = 0.0

    def check_now(self) -> None:
        """Make the next check due at once (a commit round found a topic id that changed)."""
        self._next_check = 0.0

    @property
    def has_topic_ids(self) -> bool:
        """Whether the broker gives topic ids (then they alone show a topic created again)."""
        return any(shape.topic_id for shape in self.shapes.values())

    async def look(self, consumer: AIOKafkaConsumer) -> None:
        """Note the topics' ids when the stream starts (the first check compares with them)."""
        self.shapes = await read_topic_shapes(consumer._client, self.topics) or {}

    async def follow(self, consumer: AIOKafkaConsumer, producer: KafkaSharedStreamProducer) -> None:
        """
        Read partitions added and topics created again from their start (a check first).

        Runs between fetches, in the task that yields, like :meth:`.WatcherPositions.admit`. The
        stream's and every watcher's position on each such lane become its log start, committed
        now; records of an old log still in flight, or kept for a later fold, settle nothing
        (``producer.renewed_at``, checked where the settler folds them).
        """
        try:
            added, renewed = await self.check(consumer, producer.positions.lanes)
        except KafkaError as exc:  # a broker restarting, say: the reads go on, the next check sees
            log.info("Checking the partitions of %s failed (%s)", ",".join(self.topics), type(exc).__name__)
            return
        self.following = renewed  # no commit on them until their new logs' starts are placed
        try:
            await self._follow(consumer, producer, added, renewed)
        finally:
            self.following = set()

    async def _follow(
        self,
        consumer: AIOKafkaConsumer,
        producer: KafkaSharedStreamProducer,
        added: list[TopicPartition],
        renewed: set[str],
    ) -> None:
        try:
            lanes = producer.positions.lanes
            dropped = [
                tp for tp in lanes if tp.topic in renewed and tp.partition >= self.shapes[tp.topic].partitions
            ]
            fresh = added + [tp for tp in lanes if tp.topic in renewed and tp not in dropped]
            if not fresh and not dropped:
                return
            for tp in fresh:  # what was yielded so far is of the old logs (nothing is yielded now)
                if tp.topic in renewed:
                    producer.renewed_at[(tp.topic, tp.partition)] = producer._seq
            for tp in dropped:  # created again with fewer partitions: these lanes are gone
                producer.renewed_at[(tp.topic, tp.partition)] = producer._seq
                lanes.remove(tp)
                producer.ledger.forget((tp.topic, tp.partition))
                log.warning("Kafka %s/%d is gone (the topic was created again with fewer partitions)", *tp)
            if added or dropped:  # assign() forgets every position: keep the ones read so far
                kept = {tp: await consumer.position(tp) for tp in lanes if tp.topic not in renewed}
                lanes.extend(added)
                consumer.assign(lanes)
                for tp, position in kept.items():
                    consumer.seek(tp, position)
            starts = {tp: bounds.start for tp, bounds in (await read_log_bounds(consumer, fresh)).items()}
            if starts:
                await consumer.commit(starts)
        except KafkaError as exc:
            raise producer._error("following the partitions of the stream's topics", exc) from None
        for tp, start in starts.items():
            lane = (tp.topic, tp.partition)
            producer._rewind(tp, start)
            producer.ledger.forget(lane)
            producer.committer.queue(tp, start)
            new_log = tp.topic in renewed
            log.warning(
                "Kafka %s/%d %s: reading it from its start %d",
                tp.topic,
                tp.partition,
                "is a new log (the topic was deleted and created again)" if new_log else "was added",
                start,
            )
        producer.positions.restart_lanes(starts)

    async def check(self, consumer: AIOKafkaConsumer, lanes: Sequence[TopicPartition]) -> ClusterChanges:
        """Compare the topics with the last check; a client error propagates."""
        self._next_check = time.monotonic() + self.interval
        shapes = await read_topic_shapes(consumer._client, self.topics)
        if shapes is None:  # no Metadata v10: partition counts from aiokafka's own metadata
            await consumer._client.force_metadata_update()
            shapes = {
                topic: TopicShape("", len(found))
                for topic in self.topics
                if (found := consumer.partitions_for_topic(topic))
            }
        renewed: set[str] = set()
        for topic in self.topics:
            now, before = shapes.get(topic), self.shapes.get(topic)
            if now is None:
                if topic not in self.gone:  # deleted (for good, or to be created again): say so once
                    log.warning(
                        "Kafka topic %s is gone (deleted): its positions are not committed until it "
                        "is created again, and then it is read from its start",
                        topic,
                    )
                self.gone.add(topic)
                continue
            if topic in self.gone or (before is not None and before.topic_id != now.topic_id):
                renewed.add(topic)
            self.gone.discard(topic)
        self.shapes.update(shapes)
        # A topic's partitions are never taken away: fewer of them is a topic created again.
        renewed |= {
            tp.topic for tp in lanes if tp.topic in shapes and tp.partition >= shapes[tp.topic].partitions
        }
        if not self.has_topic_ids:  # a broker with ids may report its log end late (Tansu)
            renewed |= await self._ending_below(
                consumer,
                [tp for tp in lanes if tp.topic in shapes and tp.partition < shapes[tp.topic].partitions],
            )
        read = set(lanes)
        added = [
            TopicPartition(topic, partition)
            for topic, shape in sorted(shapes.items())
            for partition in range(shape.partitions)
            if TopicPartition(topic, partition) not in read
        ]
        return ClusterChanges(added, renewed)

    @staticmethod
    async def _ending_below(consumer: AIOKafkaConsumer, lanes: list[TopicPartition]) -> set[str]:
        """Topics with a partition whose log ends below what the consumer has read: a new log."""
        if not lanes:
            return set()
        ends = await consumer.end_offsets(lanes)
        renewed: set[str] = set()
        for tp in lanes:
            end = ends.get(tp)
            if end is not None and end < await consumer.position(tp):
                renewed.add(tp.topic)
        return renewed
