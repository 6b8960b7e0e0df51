"""
Durable per-watcher positions, kept in Kafka's own offset store without group membership.

Each watcher of a Kafka stream has its own consumer group id (see
:func:`~airflow_shared_stream.kafka.identity.watcher_group_id`), used only as a key of Kafka's
offset store: nothing ever *joins* it. Its offsets are written with ``OffsetCommit`` at generation
``-1`` and an empty member id, the "simple consumer" commit every Kafka-protocol broker accepts
for a group with no members, and read back with ``OffsetFetch``. So positions survive the
triggerer and move with the watcher to whichever triggerer runs it next, and no broker ever
splits partitions between triggerers: there is no membership to split.

Why not one ``AIOKafkaConsumer`` per watcher group: each would open its own connections and
coordinator lookups for what is two small requests; these go through the stream consumer's own
client (``AIOKafkaConsumer._client``, the one aiokafka object that exposes ``send``).
"""

from __future__ import annotations

import asyncio
import logging
from collections import defaultdict
from collections.abc import Iterable, Mapping
from typing import Any, NamedTuple

from aiokafka import TopicPartition
from aiokafka.errors import (
    CommitFailedError,
    CoordinatorLoadInProgressError,
    CoordinatorNotAvailableError,
    IllegalGenerationError,
    KafkaError,
    NotCoordinatorForGroupError,
    RebalanceInProgressError,
    UnknownMemberIdError,
    UnknownTopicOrPartitionError,
    for_code,
)
from aiokafka.protocol.commit import OffsetCommitRequest, OffsetFetchRequest

from airflow_shared_stream.kafka.topic_ids import read_topic_shapes

log = logging.getLogger(__name__)

NO_GENERATION = -1
"""Generation of a commit made without group membership (Kafka's ``simple consumer`` commit)."""
NO_MEMBER = ""
DEFAULT_RETENTION = -1
"""Let the broker apply its own ``offsets.retention.minutes``."""
FENCED = (UnknownMemberIdError, IllegalGenerationError, RebalanceInProgressError)
"""A commit's answers that say the group has (other) members now: what aiokafka calls a failed
commit (``CommitFailedError``); the partitions may be another member's."""

COORDINATOR_MOVED = (
    CoordinatorLoadInProgressError,
    CoordinatorNotAvailableError,
    NotCoordinatorForGroupError,
)
FETCH_ATTEMPTS = 12
"""How often a read of positions is asked again while the coordinator is loading or moved."""
FETCH_BACKOFF = (0.1, 2.0)
"""First and longest wait between two such reads (doubling): about 15 s in all."""


class GroupMember(NamedTuple):
    """Who commits as a member of a group's generation (a simple commit has neither)."""

    generation: int
    member_id: str


SIMPLE_COMMIT = GroupMember(NO_GENERATION, NO_MEMBER)


class Committed(NamedTuple):
    """What a group has committed: offsets, and the metadata string each was committed with."""

    offsets: dict[TopicPartition, int]
    metadata: dict[TopicPartition, str]


class PositionStore:
    """
    Read and write the committed offsets of arbitrary group ids through one started client.

    :param client: a started ``aiokafka.client.AIOKafkaClient`` (the stream consumer's).
    """

    def __init__(self, client: Any) -> None:
        self._client = client
        self._coordinators: dict[str, int] = {}

    async def _coordinator(self, group: str) -> int:
        node = self._coordinators.get(group)
        if node is None:
            node = await self._client.coordinator_lookup(0, group)
            self._coordinators[group] = node
        return node

    async def _send(self, group: str, request: Any) -> Any:
        node = await self._coordinator(group)
        try:
            return await self._client.send(node, request)
        except KafkaError:
            self._coordinators.pop(group, None)
            raise

    async def fetch(self, group: str, partitions: Iterable[TopicPartition]) -> Committed:
        """
        The committed offsets of ``group`` on ``partitions``; partitions without one are absent.

        A coordinator that is loading the group's offsets, or is not its coordinator any more,
        says so in the request-level error code (OffsetFetch v2+) and lists no partition: that is
        "ask again", never "no position" (a watcher taken for new is anchored past its records).
        Asked again, through a fresh coordinator lookup, until it answers or the attempts run out.
        """
        wanted = list(partitions)
        wait, longest = FETCH_BACKOFF
        for _ in range(FETCH_ATTEMPTS - 1):
            try:
                return await self._fetch_once(group, wanted)
            except COORDINATOR_MOVED as exc:
                log.info("Position of %r not read (%s): asking again", group, type(exc).__name__)
            await asyncio.sleep(wait)
            wait = min(wait * 2, longest)
        return await self._fetch_once(group, wanted)  # the last answer, whatever it is

    async def _fetch_once(self, group: str, partitions: list[TopicPartition]) -> Committed:
        by_topic: dict[str, list[int]] = defaultdict(list)
        for tp in partitions:
            by_topic[tp.topic].append(tp.partition)
        request = OffsetFetchRequest(group, sorted(by_topic.items()))
        response = await self._send(group, request)
        self._raise_for(group, getattr(response, "error_code", 0))  # request-level, v2+
        found = Committed({}, {})
        for topic, parts in response.topics:
            for fields in parts:  # (partition, offset, [leader epoch,] metadata, error code)
                partition, offset, metadata, error_code = fields[0], fields[1], fields[-2], fields[-1]
                self._raise_for(group, error_code)
                if offset >= 0:
                    tp = TopicPartition(topic, partition)
                    found.offsets[tp] = offset
                    found.metadata[tp] = metadata or ""
        return found

    async def commit(
        self,
        group: str,
        offsets: Mapping[TopicPartition, int],
        metadata: str = "",
        *,
        member: GroupMember = SIMPLE_COMMIT,
        retention_ms: int = DEFAULT_RETENTION,
    ) -> None:
        """
        Make ``offsets`` the committed offsets of ``group`` (by default no membership, generation -1).

        ``metadata`` goes with every offset: Kafka's own place for what the committer wants to say
        about a position (:mod:`~airflow_shared_stream.kafka.marks`). Some brokers drop it (Tansu).
        ``retention_ms`` other than -1 keeps the offsets that long after this commit, whatever the
        broker's ``offsets.retention.minutes`` (OffsetCommit v2 to v4; Kafka honours it).
        """
        if not offsets:
            return
        refused = await self._commit_once(group, offsets, metadata, member, retention_ms)
        wait, longest = FETCH_BACKOFF
        for _ in range(FETCH_ATTEMPTS - 1):
            if not refused:
                return
            live = await self._live(refused)
            for tp in [tp for tp in refused if tp not in live]:
                # Deleted (maybe being created again): a position on a gone log means nothing,
                # and failing the stream would forget which watchers were away from the new
                # one. The stream commits the new log's start when it sees it.
                log.info(
                    "Position of %r on %s/%d not committed: the topic is gone", group, tp.topic, tp.partition
                )
                del refused[tp]
            if not refused:
                return
            # A live partition the coordinator does not know yet (added, or its topic just
            # created: a broker learns of it after the controller). Dropped, it would be lost to
            # a kill before the next refresh: asked again until the coordinator has it.
            log.info("Position of %r on %s not committed yet: asking again", group, sorted(refused))
            await asyncio.sleep(wait)
            wait = min(wait * 2, longest)
            refused = await self._commit_once(group, refused, metadata, member, retention_ms)
        if refused:
            raise UnknownTopicOrPartitionError(f"offsets of group {group!r} on {sorted(refused)}")

    async def _commit_once(
        self,
        group: str,
        offsets: Mapping[TopicPartition, int],
        metadata: str,
        member: GroupMember = SIMPLE_COMMIT,
        retention_ms: int = DEFAULT_RETENTION,
    ) -> dict[TopicPartition, int]:
        """One OffsetCommit; the partitions the coordinator does not know (UNKNOWN_TOPIC_OR_PARTITION)."""
        by_topic: dict[str, list[tuple[int, int, str]]] = defaultdict(list)
        for tp, offset in offsets.items():
            by_topic[tp.topic].append((tp.partition, offset, metadata))
        request = OffsetCommitRequest(
            group, member.generation, member.member_id, retention_ms, sorted(by_topic.items())
        )
        response = await self._send(group, request)
        refused: dict[TopicPartition, int] = {}
        for topic, parts in response.topics:
            for fields in parts:  # (partition, error code)
                if fields[-1] == UnknownTopicOrPartitionError.errno:
                    tp = TopicPartition(topic, fields[0])
                    refused[tp] = offsets[tp]
                    continue
                self._raise_for(group, fields[-1])
        return refused

    async def _live(self, partitions: Iterable[TopicPartition]) -> set[TopicPartition]:
        """Those of ``partitions`` the cluster's metadata has now (asked afresh, no auto-creation)."""
        wanted = list(partitions)
        shapes = await read_topic_shapes(self._client, sorted({tp.topic for tp in wanted}))
        if shapes is not None:
            counts = {topic: shape.partitions for topic, shape in shapes.items()}
        else:  # no Metadata v10
            cluster = await self._client.fetch_all_metadata()
            counts = {tp.topic: len(cluster.partitions_for_topic(tp.topic) or ()) for tp in wanted}
        return {tp for tp in wanted if tp.partition < counts.get(tp.topic, 0)}

    async def commit_asking_again(
        self,
        group: str,
        offsets: Mapping[TopicPartition, int],
        metadata: str = "",
        *,
        member: GroupMember = SIMPLE_COMMIT,
        retention_ms: int = DEFAULT_RETENTION,
    ) -> None:
        """
        :meth:`commit`, asked again (bounded, as :meth:`fetch` is) after a retriable error: a
        coordinator loading or moved, a connection closed, a request timed out. Every position
        commit goes through here, the stream's and each watcher's: a watcher's that failed the
        stream at a coordinator move would restart it, and a restarted stream forgets which
        watchers were away from a topic created again (they then skip its new log).

        The stream's own commits go through here, not ``AIOKafkaConsumer.commit``: that one takes
        ``UNKNOWN_TOPIC_OR_PARTITION`` (a topic deleted for good) for retriable and asks again for
        ever, so the committer's round, which folds every watcher's ACKs, would never end and no
        position of the stream would move again. Here that partition is dropped, as for a watcher.
        """
        wait, longest = FETCH_BACKOFF
        for attempt in range(1, FETCH_ATTEMPTS + 1):
            try:
                return await self.commit(group, offsets, metadata, member=member, retention_ms=retention_ms)
            except FENCED as exc:
                # A consumer joined the group, or it rebalanced: what AIOKafkaConsumer.commit says
                # (on the last attempt too: its caller waits for the rebalance, never fails).
                raise CommitFailedError(f"offsets of group {group!r}: {type(exc).__name__}") from None
            except UnknownTopicOrPartitionError:
                raise  # :meth:`commit` asked that again already (about 15 s)
            except KafkaError as exc:
                if not exc.retriable or attempt == FETCH_ATTEMPTS:
                    raise  # the last answer, whatever it is
                log.info("Position of %r not committed (%s): asking again", group, type(exc).__name__)
            await asyncio.sleep(wait)
            wait = min(wait * 2, longest)

    def _raise_for(self, group: str, error_code: int) -> None:
        if not error_code:
            return
        error = for_code(error_code)
        if issubclass(error, COORDINATOR_MOVED):
            self._coordinators.pop(group, None)
        raise error(f"offsets of group {group!r}")
