"""
Which partitions the consumer owns, and since when: what makes a settlement safe after a rebalance.

aiokafka rebalances eagerly: every partition is revoked, then the new assignment is handed out,
possibly back to the same consumer. A message read before a revoke belongs to whoever owns its
partition next, which reads it again from the last commit; settling it here would commit or seek a
partition that is no longer ours (or that is ours again, under a newer read). Two counters per
partition tell the cases apart:

* the **assignment epoch**, bumped on every revoke and carried by each message read: a message
  whose epoch is not the partition's current one is never settled;
* the **fetch epoch**, bumped on every revoke and every seek: records of a fetch made before it
  are stale and are dropped instead of yielded.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable

from aiokafka import TopicPartition


class PartitionOwnership:
    """
    The assignment and fetch epochs of every partition (see the module docstring).

    :param assignment: the consumer's live assignment (``AIOKafkaConsumer.assignment``); a
        partition is owned only while it is in it *and* its epoch is the one asked about.
    """

    def __init__(self, assignment: Callable[[], Collection[TopicPartition]] = frozenset) -> None:
        self._assignment = assignment
        self._assignment_epochs: dict[TopicPartition, int] = {}
        self.fetch_epochs: dict[TopicPartition, int] = {}
        """The fetch epoch of each partition (0 until its first revoke or seek). Read it, the
        methods change it: the stream compares it once per record, without a call."""

    def bind(self, assignment: Callable[[], Collection[TopicPartition]]) -> None:
        """Follow another consumer's assignment (the producer's, once it has connected)."""
        self._assignment = assignment

    def epoch(self, tp: TopicPartition) -> int:
        """The partition's assignment epoch: stamp it on every message read now."""
        return self._assignment_epochs.get(tp, 0)

    def owns(self, tp: TopicPartition, epoch: int) -> bool:
        """Read since the partition's last revoke, and still assigned (aiokafka's live view)."""
        return self._assignment_epochs.get(tp, 0) == epoch and tp in self._assignment()

    def revoked(self, partitions: Iterable[TopicPartition]) -> None:
        """The partitions were taken away: everything read or fetched before is someone else's."""
        for tp in partitions:
            self._assignment_epochs[tp] = self._assignment_epochs.get(tp, 0) + 1
            self.fetch_epochs[tp] = self.fetch_epochs.get(tp, 0) + 1

    def rewound(self, tp: TopicPartition) -> None:
        """The consumer sought back on ``tp``: records fetched before are stale."""
        self.fetch_epochs[tp] = self.fetch_epochs.get(tp, 0) + 1
