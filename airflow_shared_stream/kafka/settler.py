"""
Settling advanced records per partition: commit targets, watcher positions, seeks, metrics.

A partition is an ordered lane. Its records are settled in advance order: ACKs move its commit
target (cumulative, :mod:`.offsets`), a REDELIVER holds its offset as the lane's floor and seeks
the consumer back to it, and every admitted watcher's position moves over the records settled
for good (:mod:`.watcher_positions`). The commits themselves are sent by the committer task.

ACK-only batches, nearly every batch, need nothing from the broker, so they are only kept and
folded together: at the committer's round, before a watcher's last position is sent, before a
batch that is not all ACKs (so each lane still folds in advance order), or once ``FOLD_ACKS_AT``
messages wait (folding early frees the advance items, which otherwise live long enough to reach
the garbage collector's older generations).

A topic deleted and created again numbers its records from 0 again. The records of its old log
still in flight, or kept here unfolded, name offsets of a log that is gone: settling them moves
nothing (:attr:`LaneSettler.renewed_at`), checked where they are folded, so a fold that comes late
(a loaded loop, a slow commit, a dead-letter send) cannot move a position over the new log's
records.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

from aiokafka import TopicPartition
from airflow.triggers.shared_stream import AdvanceItem

from airflow_shared_stream.common import metrics as m
from airflow_shared_stream.common.flow_control import CreditWindow
from airflow_shared_stream.common.leased_queue import NoSubscriberBackoff
from airflow_shared_stream.common.metrics import StreamMetrics
from airflow_shared_stream.common.settlement import Settlement
from airflow_shared_stream.kafka.committer import OffsetCommitter
from airflow_shared_stream.kafka.envelope import KafkaBrokerPayload
from airflow_shared_stream.kafka.offsets import OffsetLedger
from airflow_shared_stream.kafka.watcher_positions import WatcherPositions

log = logging.getLogger(__name__)

FOLD_ACKS_AT = 32
"""ACK-only advances are folded as soon as this many messages wait (else at the committer's round)."""


class LaneSettler:
    """
    The settlement of one stream's partitions (see the module docstring).

    :param seek: moves the consumer back to an offset of a partition (and marks what it fetched
        before as stale).
    """

    def __init__(
        self,
        *,
        committer: OffsetCommitter,
        positions: WatcherPositions,
        metrics: StreamMetrics,
        credits: CreditWindow,
        backoff: NoSubscriberBackoff,
        seek: Callable[[TopicPartition, int], None],
    ) -> None:
        self.ledger = OffsetLedger()
        self.committer = committer
        self.positions = positions
        self.metrics = metrics
        self.credits = credits
        self.backoff = backoff
        self._seek = seek
        self._kept: list[Sequence[AdvanceItem]] = []
        """ACK-only batches advanced since the last fold."""
        self._kept_count = 0
        """Messages in :attr:`_kept`."""
        self.renewed_at: dict[tuple[str, int], int] = {}
        """Per lane created again: the first sequence number of its new log; records yielded
        before are of the old log, and settling them must move no position of the new one."""

    def of_current_logs(self, items: Sequence[AdvanceItem]) -> Sequence[AdvanceItem]:
        """``items`` without the records of a lane's old log (yielded before it was created again)."""
        renewed_at = self.renewed_at
        if not renewed_at:
            return items
        return [
            item
            for item in items
            if item.broker_payload.seq
            >= renewed_at.get((item.broker_payload.topic, item.broker_payload.partition), -1)
        ]

    def keep_acks(self, batch: Sequence[AdvanceItem]) -> None:
        """Keep an ACK-only batch for the next fold; the first one kept wakes the committer's round."""
        kept = self._kept
        if not kept:
            self.committer.wake()
        kept.append(batch)
        self._kept_count += len(batch)
        if self._kept_count >= FOLD_ACKS_AT:
            self.fold_acks()
        backoff = self.backoff
        if backoff.delay:
            backoff.someone_subscribed()

    def fold_acks(self) -> None:
        """Fold the kept ACK-only batches into commit targets and watcher positions, lane by lane."""
        pending, self._kept = self._kept, []
        self._kept_count = 0
        lanes: dict[tuple[str, int], list[AdvanceItem]] = {}
        for batch in pending:
            first: KafkaBrokerPayload = batch[0].broker_payload
            lane = lanes.get((first.topic, first.partition))
            if lane is None:
                lanes[(first.topic, first.partition)] = list(batch)
            else:
                lane.extend(batch)
        metrics = self.metrics
        for (topic, partition), lane_items in lanes.items():
            items = self.of_current_logs(lane_items)
            if not items:
                continue
            settled = [item.broker_payload for item in items]
            commit = self.ledger.settle_acks((topic, partition), [payload.offset for payload in settled])
            self._carry_out(TopicPartition(topic, partition), commit, None, settled)
            metrics.acks_queued(len(items), sum(item.outcome.acked for item in items), self.credits.in_flight)

    def fold(self, tp: TopicPartition, batch: Sequence[AdvanceItem], plan: Sequence[Settlement]) -> None:
        """
        Settle a lane's batch, ``plan`` its settlements in order (dead letters already sent).

        The caller folds the kept ACKs first, so the lane folds in advance order. Records of the
        lane's old log (created again while their dead letters were sent) are left out.
        """
        if self.renewed_at:
            first_new = self.renewed_at.get((tp.topic, tp.partition), -1)
            current = [
                pair for pair in zip(batch, plan, strict=True) if pair[0].broker_payload.seq >= first_new
            ]
            if not current:
                return
            batch, plan = [item for item, _ in current], [settlement for _, settlement in current]
        items: list[tuple[int, Settlement]] = []
        settled: list[KafkaBrokerPayload] = []
        counts = dict.fromkeys(Settlement, 0)
        for item, settlement in zip(batch, plan, strict=True):
            counts[settlement] += 1
            payload = item.broker_payload
            items.append((payload.offset, settlement))
            if settlement is not Settlement.REDELIVER:
                settled.append(payload)
        action = self.ledger.settle((tp.topic, tp.partition), items)
        self._carry_out(tp, action.commit, action.seek, settled)
        metrics = self.metrics
        nobody = metrics.settled(
            batch,
            acked=counts[Settlement.ACK],
            redelivered=counts[Settlement.REDELIVER],
            dead_lettered=counts[Settlement.DEAD_LETTER],
        )
        metrics.gauge(m.IN_FLIGHT, self.credits.in_flight)
        if nobody == len(batch):
            self.backoff.nobody_subscribed()  # no spinning on it until somebody is
        else:
            self.backoff.someone_subscribed()

    def _carry_out(
        self, tp: TopicPartition, commit: int | None, seek: int | None, settled: list[KafkaBrokerPayload]
    ) -> None:
        """Queue a folded lane's commit, move the watchers over ``settled``, seek back."""
        log.debug(
            "Kafka %s/%d settled %d -> commit %s, seek %s", tp.topic, tp.partition, len(settled), commit, seek
        )
        if commit is not None:
            self.committer.queue(tp, commit)
        if settled and self.positions.watchers.cursors:
            self.positions.advance(tp, settled)
        if seek is not None:
            self._seek(tp, seek)
            log.info("Redelivering %s/%d from offset %d", tp.topic, tp.partition, seek)
