"""
No position is committed on a topic that is not the log the stream's baseline names.

A topic deleted and created again keeps its name, and its records are numbered from 0 again.
The stream checks its topics' ids only every few seconds (:mod:`.cluster_watch`); between a
re-creation and that check it reads the new topic at its old position, and a commit of what it
read there (the stream's, or a watcher's) would look to every later start like a position on the
new topic: a restart then skips the new topic's records below it.

So before a commit round sends its targets, the topics' ids are read again (one Metadata v10
request for the stream's topics, shared by the rounds that wait for it). The targets of a topic
whose id is not the one :attr:`.ClusterWatch.shapes` holds, or that is missing, or that the
stream is about to read from its start (:attr:`.ClusterWatch.gone`, :attr:`.ClusterWatch.following`)
are withheld, and the cluster check is made due now: :meth:`.ClusterWatch.follow` reads the new log
from its start (WARNING) before anything is committed on it. Every record a round commits was
fetched before the round began, and the read begins after it: a record of the new log means the
read sees the new id. A withheld target only leaves a position behind (duplicates, never loss).

Only on brokers with topic ids: without them (noida-db) a topic's ids say nothing.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from aiokafka import TopicPartition
from aiokafka.errors import KafkaError

from airflow_shared_stream.kafka.positions import FETCH_ATTEMPTS, FETCH_BACKOFF
from airflow_shared_stream.kafka.topic_ids import TopicShape, read_topic_shapes

if TYPE_CHECKING:
    from airflow_shared_stream.kafka.cluster_watch import ClusterWatch
    from airflow_shared_stream.kafka.topic_memory import TopicMemory

log = logging.getLogger(__name__)

READ_ATTEMPTS = FETCH_ATTEMPTS
"""How often a failed read of the ids is asked again before the round fails: as long as a commit
itself is asked again (0.1 s to 2 s apart, about 15 s in all), so a broker restart that a commit
lives through does not fail the stream here (a restarted stream forgets which watchers were away
from a topic created again)."""


class CommitGuard:
    """
    Filter every commit of the stream's positions through a fresh read of its topics' ids.

    :param cluster: the stream's baseline (ids at start, and as :meth:`.ClusterWatch.follow` saw).
    :param memory: told which topic ids the stream committed positions on (:mod:`.topic_memory`).
    """

    def __init__(self, cluster: ClusterWatch, memory: TopicMemory | None = None) -> None:
        self.cluster = cluster
        self.memory = memory
        self._client: Any = None
        self._lock = asyncio.Lock()
        self._arrivals = 0
        self._last: tuple[int, dict[str, TopicShape] | None] | None = None
        self.reads = 0
        """Metadata requests made (for the measurement in docs/kafka.rst)."""

    def bind(self, client: Any) -> None:
        """Read ids through this started client (the stream consumer's)."""
        self._client = client

    async def admit(self, offsets: Mapping[TopicPartition, int]) -> dict[TopicPartition, int]:
        """The targets of ``offsets`` that may be committed now (see the module docstring)."""
        if not offsets or self._client is None or not self.cluster.has_topic_ids:
            return dict(offsets)
        shapes = await self._current()
        if shapes is None:  # the broker stopped answering Metadata v10: nothing to compare
            return dict(offsets)
        cluster = self.cluster
        withheld: set[str] = set()
        for topic in {tp.topic for tp in offsets}:
            now, baseline = shapes.get(topic), cluster.shapes.get(topic)
            if (
                now is None
                or baseline is None
                or now.topic_id != baseline.topic_id
                or topic in cluster.gone
                or topic in cluster.following
            ):
                withheld.add(topic)
        if not withheld:
            return dict(offsets)
        for topic in sorted(withheld):
            log.info(
                "Kafka topic %s is not the log the stream read (deleted, or created again): its "
                "positions are not committed until the stream has read it from its start",
                topic,
            )
        cluster.check_now()
        return {tp: offset for tp, offset in offsets.items() if tp.topic not in withheld}

    def committed(self, offsets: Mapping[TopicPartition, int]) -> None:
        """``offsets`` were committed: the topic ids they were committed on are the stream's memory."""
        if self.memory is None or not offsets:
            return
        cluster = self.cluster
        self.memory.committed_on(
            {
                topic: shape.topic_id if (shape := cluster.shapes.get(topic)) is not None else ""
                for topic in {tp.topic for tp in offsets}
                if topic not in cluster.gone and topic not in cluster.following
            }
        )

    async def _current(self) -> dict[str, TopicShape] | None:
        """
        The topics' shapes from a read that began after this call: the rounds waiting together
        share one read, never one that began before them (its answer may predate their records).
        """
        self._arrivals += 1
        arrival = self._arrivals
        async with self._lock:
            last = self._last
            if last is not None and last[0] >= arrival:
                return last[1]
            began = self._arrivals
            shapes = await self._read()
            self._last = (began, shapes)
            return shapes

    async def _read(self) -> dict[str, TopicShape] | None:
        wait, longest = FETCH_BACKOFF
        for attempt in range(1, READ_ATTEMPTS + 1):
            try:
                self.reads += 1
                return await read_topic_shapes(self._client, self.cluster.topics)
            except KafkaError as exc:
                if attempt == READ_ATTEMPTS:
                    raise
                log.info(
                    "Reading the topic ids before a commit failed (%s): asking again", type(exc).__name__
                )
            await asyncio.sleep(wait)
            wait = min(wait * 2, longest)
        return None  # pragma: no cover - the loop returns or raises
