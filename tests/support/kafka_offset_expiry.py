"""
Kafka's expiry of committed offsets, applied by a test to brokers that never expire them.

Neither test broker expires offsets on its own clock, and a test cannot wait days. Kafka's rule
(``OffsetMetadataManager.expireTimestampMs`` and ``GroupMetadata``'s expired offsets) is: an
offset committed with a ``retention_time`` (OffsetCommit v2 to v4) expires that long after its
commit; one committed without (-1) expires ``offsets.retention.minutes`` after its group became
empty, or after its commit for a group that never had members. This model records every
OffsetCommit this process sends and, asked to let a group sit idle for some days, deletes its
offsets when Kafka would (DeleteGroups: the test brokers delete a group's offsets all at once).
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from aiokafka.client import AIOKafkaClient
from aiokafka.protocol.commit import OffsetCommitRequest

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
        assert all(expired.values()), f"a part of {group!r}'s offsets expired: {expired} (not modelled)"
        await sandbox.delete_groups(group)
        return True
