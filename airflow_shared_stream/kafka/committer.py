"""
The commit task: sends the commit points of every partition in one request per round trip.

The manager awaits one ``advance`` at a time across all lanes. Awaiting a commit per advance
would cap the stream at one broker round trip per message, so ``advance`` only records a target
here and this task sends the targets of every partition together, at most every
``COMMIT_INTERVAL``. A target that has not reached the broker when the triggerer dies only means
redelivery, which at-least-once allows.

It also remembers the newest target of each partition, so :meth:`OffsetCommitter.refresh` can
commit it again: a broker expires the offsets of a group without members
``offsets.retention.minutes`` after their last commit, and an idle stream commits nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable

from aiokafka import TopicPartition
from aiokafka.errors import CommitFailedError, IllegalStateError, KafkaError, RebalanceInProgressError

from airflow_shared_stream.kafka.errors import KafkaSharedStreamError

log = logging.getLogger(__name__)

COMMIT_INTERVAL = 0.2
"""Least time between two commit requests; targets settled meanwhile go in the next one."""

LOST_TO_REBALANCE = (CommitFailedError, IllegalStateError, RebalanceInProgressError)
"""Commit failures that mean the group is someone else's now (a consumer subscribed to it):
whoever reads from the last commit redelivers, nothing is lost."""


class OffsetCommitter:
    """
    Coalesce commit targets per partition and send them from one background task.

    :param commit: sends ``{partition: offset}`` to the group coordinator
        (``AIOKafkaConsumer.commit``).
    :param describe_error: turns a client error into the stream's error (scrubbed of secrets).
    :param before_round: called first in every flush (a round, the final one): the producer
        folds the ACKs it was advanced since the last round into targets.
    :param after_round: called after every round that sent something (metrics).
    """

    def __init__(
        self,
        *,
        commit: Callable[[dict[TopicPartition, int]], Awaitable[object]],
        describe_error: Callable[[str, BaseException], KafkaSharedStreamError],
        before_round: Callable[[], None] | None = None,
        after_round: Callable[[], Awaitable[None]] | None = None,
        interval: float = COMMIT_INTERVAL,
    ) -> None:
        self._commit = commit
        self._describe_error = describe_error
        self._before_round = before_round
        self._after_round = after_round
        self.interval = interval
        self._pending: dict[TopicPartition, int] = {}
        self._known: dict[TopicPartition, int] = {}
        """The newest target per partition, sent or not: what :meth:`refresh` resends.
        Never an older one: a refresh while a newer target is in flight must not move it back."""
        self._wakeup = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self.error: KafkaSharedStreamError | None = None
        """Set when a commit failed for another reason than a rebalance: the stream must fail."""

    @property
    def pending(self) -> dict[TopicPartition, int]:
        """Targets not sent yet (a copy)."""
        return dict(self._pending)

    def queue(self, tp: TopicPartition, offset: int) -> None:
        """Commit ``offset`` for ``tp`` in the next round."""
        self._pending[tp] = self._known[tp] = offset
        self._wakeup.set()

    def seed(self, offsets: dict[TopicPartition, int]) -> None:
        """Offsets committed (or found so) before any target was queued: :meth:`refresh` resends them."""
        for tp, offset in offsets.items():
            self._known.setdefault(tp, offset)

    def refresh(self) -> None:
        """
        Commit the newest target of every partition again in the next round.

        Targets only ever grow and each was settled when it was queued, so sending one again never
        moves a position: it only renews the commit's timestamp, which keeps it from expiring.
        """
        self._pending.update(self._known)
        if self._known:
            self._wakeup.set()

    def abandon(self) -> None:
        """Stop at once and send nothing more, not even what is pending (the position is not ours)."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
        self._pending.clear()
        self._known.clear()

    def wake(self) -> None:
        """Have a round run soon: ``before_round`` has something to fold into targets."""
        self._wakeup.set()

    async def flush(self) -> None:
        """Send the pending targets in one request, now."""
        if self._before_round is not None:
            self._before_round()
        offsets, self._pending = self._pending, {}
        if not offsets:
            return
        try:
            await self._commit(offsets)
        except asyncio.CancelledError:
            # Stopped mid-request (stop() cancels the task, then flushes): put the targets back,
            # unless newer ones came meanwhile, so the final flush sends them. Sending one twice
            # is harmless; losing one would leave the position behind what was persisted.
            for tp, target in offsets.items():
                self._pending.setdefault(tp, target)
            raise
        except LOST_TO_REBALANCE as exc:
            log.info(
                "Commit refused by the group (%s); those messages will be redelivered", type(exc).__name__
            )
        except KafkaError as exc:
            self.error = self._describe_error("committing offsets failed", exc)
            log.error("%s", self.error)

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="kafka-shared-stream-committer")

    async def stop(self, final_flush_timeout: float = 10.0) -> None:
        """Stop the task and send what is pending (best effort: unsent targets mean redelivery)."""
        task, self._task = self._task, None
        if task is None:
            return
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        try:
            await asyncio.wait_for(self.flush(), final_flush_timeout)
        except Exception as exc:
            log.warning("Final commit failed (%s); those messages will be redelivered", type(exc).__name__)

    async def _run(self) -> None:
        while self.error is None:
            await self._wakeup.wait()
            self._wakeup.clear()
            try:
                await self.flush()
            except Exception as exc:  # surfaced by the next advance or fetch, which fail the group
                self.error = self._describe_error("committing offsets failed", exc)
                return
            if self._after_round is not None:
                with contextlib.suppress(Exception):
                    await self._after_round()
            # Coalesce: under load every message settles on its own, and a commit request per
            # message costs the broker and this loop more than the whole fan-out does.
            await asyncio.sleep(self.interval)
