"""
Committing where a partition starts, before its first record is read.

A group without a commit starts wherever ``auto.offset.reset`` points *each time* a consumer
starts; with ``latest`` a restart skips whatever was produced while the stream was down, and a
record read but not yet settled is skipped too. Committing the first position makes the first
start the one every later start resumes from. It runs before any record of the partition is
yielded, so nothing at or past that position has been settled.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.errors import IllegalStateError, KafkaError, RebalanceInProgressError

from airflow_shared_stream.kafka.committer import LOST_TO_REBALANCE, OffsetCommitter
from airflow_shared_stream.kafka.errors import KafkaSharedStreamError

log = logging.getLogger(__name__)


class StartAnchors:
    """
    The partitions whose start is not yet known to be committed, and the commit of each start.

    :param committer: the stream's committer, seeded with every start so its refresh renews it.
    :param describe_error: turns a client error into the stream's error (scrubbed of secrets).
    """

    def __init__(
        self,
        committer: OffsetCommitter,
        describe_error: Callable[[str, BaseException], KafkaSharedStreamError],
    ) -> None:
        self.committer = committer
        self._error = describe_error
        self.unanchored: set[TopicPartition] = set()
        self.group_id: str | None = None
        """The stream's group (for the log line), set when the producer connects."""

    async def anchor_all(self, consumer: AIOKafkaConsumer) -> None:
        """Commit the start position of every partition still unanchored that has no commit."""
        for tp in list(self.unanchored):
            if tp not in consumer.assignment():
                self.unanchored.discard(tp)
                continue
            try:
                position = await consumer.position(tp)
            except (IllegalStateError, RebalanceInProgressError):
                continue  # not assigned any more; anchored if it is again
            except KafkaError as exc:
                raise self._error(
                    f"reading the start position of {tp.topic}/{tp.partition} failed", exc
                ) from None
            await self.anchor(consumer, tp, position)

    async def anchor(self, consumer: AIOKafkaConsumer, tp: TopicPartition, position: int) -> None:
        """Make ``position`` the group's committed offset of ``tp`` if the group has none yet."""
        self.unanchored.discard(tp)
        try:
            committed = await consumer.committed(tp)
            if committed is not None:
                self.committer.seed({tp: committed})
                return
            await consumer.commit({tp: position})
            self.committer.seed({tp: position})
        except LOST_TO_REBALANCE as exc:
            log.info("Start position of %s/%d not committed (%s)", tp.topic, tp.partition, type(exc).__name__)
            return
        except KafkaError as exc:
            raise self._error(
                f"committing the start position of {tp.topic}/{tp.partition} failed", exc
            ) from None
        log.info(
            "Kafka group %r had no commit for %s/%d: committed its start offset %d",
            self.group_id,
            tp.topic,
            tp.partition,
            position,
        )
