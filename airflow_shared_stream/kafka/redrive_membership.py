"""
A Kafka redrive's membership of its consumer group: how two redrives of one dead-letter topic at
once move each record once.

A redrive joins its group (``subscribe``), so the group coordinator gives each partition of the
dead-letter topic to one member at a time and refuses a commit from a member of an older
generation (aiokafka raises ``CommitFailedError``). Before a rebalance takes a partition away,
the member finishes the batch it read (copies acknowledged, offsets committed with its
generation) and reads nothing more until it has its new assignment; a batch fetched while a
rebalance went by is dropped unread, and the partitions it came from are read again from the
committed offset (:meth:`RedriveMembership.reposition`: returning it had moved the position past
it, and the commits after would have passed records never copied). A member that joins reads each
partition it is given from the group's committed offset, or from where this redrive itself got to
if that is further (a dry run commits nothing and must not count a record twice).

A redrive killed mid-way stays a member until its session times out; then its partitions go to
a live member, which reads from the committed offsets: what the killed one copied and had not
committed is copied again (the documented at-least-once duplicate), nothing is lost.

Between two redrives the group has no member, and Kafka deletes an empty group's offsets after
``offsets.retention.minutes`` (7 days by default): the next redrive would start at the topic's
beginning and copy again everything moved before. So the member's commits carry a retention of
their own (:data:`POSITION_RETENTION_MS`, OffsetCommit's ``retention_time``, which Kafka keeps
as the offsets' expiry), far longer than a dead-letter topic keeps its records. Each assignment
commits the group's offsets on the partitions it gives again with that retention, so none of them
keeps the broker's default (a partition this redrive moves nothing on, committed before).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from typing import Any

from aiokafka import ConsumerRebalanceListener, TopicPartition
from aiokafka.errors import CommitFailedError, IllegalStateError, KafkaError

from airflow_shared_stream.kafka.positions import GroupMember, PositionStore

log = logging.getLogger(__name__)

ASSIGNMENT_TIMEOUT_SECONDS = 600.0
"""How long a redrive waits for the coordinator to give it its partitions (a killed member's
session must time out first); past it, the redrive fails loudly."""
POSITION_RETENTION_MS = 10 * 365 * 24 * 3600 * 1000
"""How long a redrive group's offsets are kept after its last commit (ten years: a dead-letter
topic's records are gone long before; deleting the group forgets them sooner)."""


class RedriveMembership(ConsumerRebalanceListener):
    """The rebalance listener of one redrive's consumer, and what its reads need to know of it."""

    def __init__(self, consumer: Any, group_id: str) -> None:
        self._consumer = consumer
        self._group_id = group_id
        self._assigned = asyncio.Event()
        self._idle = asyncio.Event()
        self._idle.set()
        self._changed = asyncio.Event()
        self.epoch = 0
        """Moves on when a rebalance begins: a fetch begun before it is dropped (:meth:`current`)."""
        self.next_offsets: dict[TopicPartition, int] = {}
        """Where this redrive got to in each partition it read (the offset after its last record)."""

    @functools.cached_property
    def _positions(self) -> PositionStore:
        """One store for the redrive's life: it keeps the group's coordinator between commits."""
        return PositionStore(self._consumer._client)

    async def on_partitions_revoked(self, revoked: Any) -> None:
        """Stop reading, and let the batch in flight settle (copied, committed) before giving it away."""
        self.epoch += 1
        self._assigned.clear()
        self._changed.set()
        await self._idle.wait()

    async def on_partitions_assigned(self, assigned: Any) -> None:
        """Read each partition from the committed offset, or from further on where this redrive got to."""
        await self._keep_committed(assigned)
        for tp in assigned:
            ours = self.next_offsets.get(tp)
            if ours is None:
                continue
            committed = await self._consumer.committed(tp)
            if committed is None or ours > committed:
                self._consumer.seek(tp, ours)
        log.info("Redrive group %s gave this redrive %s", self._group_id, sorted(assigned))
        self._assigned.set()
        self._changed.set()

    async def _keep_committed(self, assigned: Any) -> None:
        """
        Commit again, kept :data:`POSITION_RETENTION_MS`, the offsets the group has on the
        partitions it gave this member: one committed with the broker's default retention (by a
        release before this retention, or an operator's ``--reset-offsets``) expires on its own, a
        partition at a time, and this redrive re-commits only the partitions it moves records on.
        Best effort: a failure is said and the next assignment asks again.
        """
        if not assigned:
            return
        try:
            committed = await self._positions.fetch(self._group_id, assigned)
            if committed.offsets:
                await self._commit_as_member(committed.offsets)
        except (KafkaError, TimeoutError) as exc:
            log.warning(
                "Redrive group %s: its offsets on %s were not committed again with their retention (%s)",
                self._group_id,
                sorted(tp.partition for tp in assigned),
                type(exc).__name__,
            )

    async def reposition(self, partitions: Any) -> None:
        """
        Read each of ``partitions`` this member holds again from the group's committed offset, or
        from further on where this redrive got to (a batch fetched across a rebalance was dropped
        unread: the consumer's position had moved past it).
        """
        for tp in partitions:
            try:
                if tp not in self._consumer.assignment():
                    continue  # another member's now: it reads it from the committed offset
                committed = await self._consumer.committed(tp)
                ours = self.next_offsets.get(tp)
                if ours is not None and (committed is None or ours > committed):
                    self._consumer.seek(tp, ours)
                elif committed is not None:
                    self._consumer.seek(tp, committed)
                else:
                    await self._consumer.seek_to_beginning(tp)
            except IllegalStateError:
                continue  # taken by a rebalance meanwhile: the next assignment sets its position

    def _waiting(self) -> Any:
        """
        Count a wait for an assignment as the consumer's activity: aiokafka leaves the group when
        ``getmany`` was not called for ``max.poll.interval.ms`` (a batch that took longer) and
        joins again only once it is active; a redrive waiting for its assignment without it would
        wait :data:`ASSIGNMENT_TIMEOUT_SECONDS` for a join that never comes.
        """
        subscription = getattr(self._consumer, "_subscription", None)
        context = getattr(subscription, "fetch_context", None)
        return context() if context is not None else contextlib.nullcontext()

    async def wait_assigned(self) -> None:
        """Until the coordinator gave this member its partitions (none is an answer too)."""
        try:
            with self._waiting():
                await asyncio.wait_for(self._assigned.wait(), ASSIGNMENT_TIMEOUT_SECONDS)
        except asyncio.TimeoutError:
            raise TimeoutError(
                f"the group coordinator gave redrive group {self._group_id!r} no assignment"
            ) from None

    async def wait_reassigned(self, since_epoch: int) -> None:
        """Until a rebalance begun after ``since_epoch`` gave this member its new partitions."""
        with self._waiting():
            while self.epoch == since_epoch or not self._assigned.is_set():
                self._changed.clear()
                try:
                    await asyncio.wait_for(self._changed.wait(), ASSIGNMENT_TIMEOUT_SECONDS)
                except asyncio.TimeoutError:
                    raise TimeoutError(f"redrive group {self._group_id!r} did not rebalance") from None

    def still_current(self, epoch: int) -> bool:
        """Whether no rebalance began since ``epoch`` (what was fetched may be used)."""
        return epoch == self.epoch and self._assigned.is_set()

    async def commit(self, offsets: dict[TopicPartition, int]) -> None:
        """
        Commit with this member's generation, kept :data:`POSITION_RETENTION_MS`. If the group
        rebalanced first (the coordinator fences the commit), commit again what of it the new
        generation left to this redrive; the rest was copied and goes to another member
        uncommitted: it copies it again (a duplicate, never a loss). A ``KafkaError`` or
        ``TimeoutError`` propagates.
        """
        try:
            await self._commit_as_member(offsets)
            return
        except CommitFailedError:
            # A revocation that began before the fence (it waits for this batch: the epoch moved
            # on already) is the rebalance to wait for, not one after it: none may ever come.
            fenced = self.epoch if self._assigned.is_set() else self.epoch - 1
        self.end_batch()  # the rebalance goes on; this redrive waits for what it gives
        await self.wait_reassigned(fenced)
        kept = {tp: offset for tp, offset in offsets.items() if tp in self._consumer.assignment()}
        if len(kept) < len(offsets):
            log.warning(
                "Redrive group %s rebalanced before it committed %s: their copies will be made again "
                "by the redrive that has them now (duplicates)",
                self._group_id,
                sorted(tp.partition for tp in set(offsets) - set(kept)),
            )
        if kept:
            # Another member may have held a partition between the fence and this assignment (this
            # one was put out of the group meanwhile) and committed past this batch: never set it back.
            committed = await self._positions.fetch(self._group_id, kept)
            kept = {tp: offset for tp, offset in kept.items() if offset > committed.offsets.get(tp, -1)}
        if kept:
            await self._commit_as_member(kept)

    async def _commit_as_member(self, offsets: dict[TopicPartition, int]) -> None:
        # aiokafka's own commit asks the broker's default retention, with no way to say another;
        # this one is the same request as the member (its coordinator's generation and id).
        coordinator = self._consumer._coordinator
        member = GroupMember(coordinator.generation, coordinator.member_id)
        if member.generation < 0 or not member.member_id:
            # Put out of the group (aiokafka left it: a batch past max.poll.interval.ms). Sent so, this
            # is a simple commit, which Kafka accepts from anyone once the group is empty: it would set
            # back what another member copied and committed meanwhile. A fenced commit instead.
            raise CommitFailedError(f"offsets of group {self._group_id!r}: not a member now")
        await self._positions.commit_asking_again(
            self._group_id, offsets, member=member, retention_ms=POSITION_RETENTION_MS
        )

    def begin_batch(self) -> None:
        """A batch was read: a rebalance waits until :meth:`end_batch`."""
        self._idle.clear()

    def end_batch(self) -> None:
        self._idle.set()
