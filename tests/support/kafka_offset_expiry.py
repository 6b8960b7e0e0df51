"""
Kafka's expiry of committed offsets, applied by a test to brokers that never expire them.

Neither test broker expires offsets on its own clock, and a test cannot wait days. Kafka's rule
(``OffsetMetadataManager.expireTimestampMs`` and ``GroupMetadata``'s expired offsets) is: an
offset committed with a ``retention_time`` (OffsetCommit v2 to v4) expires that long after its
commit; one committed without (-1) expires ``offsets.retention.minutes`` after its group became
empty, or after its commit for a group that never had members; each partition's offset on its
own. This model records every OffsetCommit this process sends and, asked to let a group sit idle
for some days, deletes its offsets when Kafka would (DeleteGroups: the test brokers delete a
group's offsets all at once, so those Kafka keeps are committed again, with their retention).
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.client import AIOKafkaClient
from aiokafka.protocol.commit import OffsetCommitRequest

from airflow_shared_stream.kafka.positions import PositionStore

BROKER_OFFSETS_RETENTION = timedelta(days=7)
"""Kafka's default ``offsets.retention.minutes`` (KIP-186)."""


class KafkaOffsetExpiry:
    """The retention each (group, topic, partition) was last committed with, from the wire."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.retention_ms: dict[tuple[str, str, int], int] = {}
        send = AIOKafkaClient.send
        expiry = self

        async def recording_send(client: AIOKafkaClient, node_id: Any, request: Any, **kwargs: Any) -> Any:
            response = await send(client, node_id, request, **kwargs)
            if isinstance(request, OffsetCommitRequest):
                committed = {t: [p for p, error in parts if not error] for t, parts in response.topics}
                for topic, parts in request._topics:
                    for partition, *_ in parts:
                        if partition in committed.get(topic, ()):
                            key = (request._consumer_group, topic, partition)
                            expiry.retention_ms[key] = request._retention_time
            return response

        monkeypatch.setattr(AIOKafkaClient, "send", recording_send)

    def expired(self, group: str, idle: timedelta) -> dict[tuple[str, int], bool]:
        """Per partition ``group`` committed, whether Kafka would have expired it after ``idle``."""
        found = {}
        for (committer, topic, partition), retention_ms in self.retention_ms.items():
            if committer == group:
                kept = BROKER_OFFSETS_RETENTION if retention_ms < 0 else timedelta(milliseconds=retention_ms)
                found[topic, partition] = idle >= kept
        return found

    async def sit_idle(self, sandbox: Any, group: str, idle: timedelta) -> bool:
        """Let ``group`` (no member, no commit) sit ``idle``; whether its offsets expired."""
        expired = self.expired(group, idle)
        assert expired, f"no commit of group {group!r} was seen"
        if not any(expired.values()):
            return False
        # Kafka expires offsets one partition at a time (GroupMetadata.removeExpiredOffsets): the
        # others stay as committed. The test brokers delete a group whole: put those back.
        kept = {tp: self.retention_ms[(group, *tp)] for tp, gone in expired.items() if not gone}
        offsets = {}
        for topic in {t for t, _ in kept}:
            offsets.update(await self._committed(sandbox, group, topic))
        await sandbox.delete_groups(group)
        if kept:
            await self._commit_again(sandbox, group, kept, offsets)
        return True

    async def _commit_again(
        self, sandbox: Any, group: str, kept: dict[tuple[str, int], int], offsets: dict[tuple[str, int], int]
    ) -> None:
        """Commit ``offsets`` of ``kept`` partitions again, each with the retention it had."""
        consumer = AIOKafkaConsumer(bootstrap_servers=sandbox.bootstrap, enable_auto_commit=False)
        await consumer.start()
        try:
            for retention in sorted(set(kept.values())):
                part = {TopicPartition(t, p): offsets[t, p] for (t, p), ms in kept.items() if ms == retention}
                await PositionStore(consumer._client).commit_asking_again(group, part, retention_ms=retention)
        finally:
            await consumer.stop()

    async def _committed(self, sandbox: Any, group: str, topic: str) -> dict[tuple[str, int], int]:
        partitions = 1 + max(p for (g, t, p) in self.retention_ms if g == group and t == topic)
        found = await sandbox.committed(group, topic, partitions)
        return {(topic, p): offset for p, offset in found.items() if offset is not None}
