"""
The example broker's operator features: its backlog, its dead-letter depth and its redrive.

docs/writing-a-broker.rst shows it piece by piece (the ``[START ...]``/``[END ...]`` markers). In
a broker package the redrive source is ``redrive.py`` and the rest ``operations.py``; the broker
appears on the Streams page and in redrives with one line in the registry
(``airflow_shared_stream/brokers.py``), and nothing outside its folder changes
(tests/integration/contract/test_memory_operations.py).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from airflow_shared_stream.common.matching import build_message
from airflow_shared_stream.common.operations import Backlog, BrokerOperations, DepthRead
from airflow_shared_stream.common.redrive import (
    DeadLetterSource,
    RedriveConfigurationError,
    RedriveItem,
    RedriveRoute,
    RedriveSnapshot,
)
from airflow_shared_stream.common.trigger import DEFAULT_MAX_PAYLOAD_BYTES
from docs.examples.memory_broker import (
    NAMESPACES,
    MemoryQueue,
    MemoryQueueNotFoundError,
    MemorySharedStreamHook,
    MemorySharedStreamTrigger,
    QueueName,
    Received,
)


# [START redrive]
class MemoryDeadLetterSource:
    """Reads a dead-letter queue, copies to the stream's queue, then deletes what was copied."""

    broker = "memory"

    def __init__(
        self,
        *,
        source: str | None,
        dead_letter: str | None,
        conn_id: str | None = None,
        keep_origin_attributes: bool = False,
    ) -> None:
        if not source or not dead_letter:
            raise RedriveConfigurationError("a memory redrive needs source and dead_letter (queue names)")
        self._source = QueueName.parse(source, "source").name
        self._dead_letter = QueueName.parse(dead_letter, "dead_letter").name
        self._conn_id = conn_id or MemorySharedStreamHook.default_conn_name
        self.label = self._dead_letter
        self.lease_seconds: float | None = 30.0
        self._queues: dict[str, MemoryQueue] = {}
        self._snapshot: set[str] = set()

    @property
    def route(self) -> RedriveRoute:
        return RedriveRoute("queue", read_from=self._dead_letter, write_to=self._source)

    async def open(self) -> None:
        config = await MemorySharedStreamHook(self._conn_id).aget_client_config()
        self._queues = NAMESPACES.get(config.namespace, {})
        for name in (self._dead_letter, self._source):
            if name not in self._queues:
                raise MemoryQueueNotFoundError(f"queue {name!r} does not exist in {config.namespace!r}")
        self.lease_seconds = self._queues[self._dead_letter].lease_seconds

    async def close(self) -> None:
        """Nothing to close: a real client closes its connection here."""

    async def snapshot(self) -> RedriveSnapshot:
        """The messages the dead-letter queue holds now: the redrive never reads past them."""
        self._snapshot = self._queues[self._dead_letter].message_ids()
        return RedriveSnapshot(depth=len(self._snapshot), bound=f"{len(self._snapshot)} message(s)")

    async def read(self, limit: int) -> Sequence[RedriveItem]:
        return [
            RedriveItem(
                key=m.message_id,
                envelope=build_message(
                    m.body,
                    metadata={"message_id": m.message_id, "queue": self._dead_letter},
                    label=m.message_id,
                    max_payload_bytes=DEFAULT_MAX_PAYLOAD_BYTES,
                ).envelope,
                handle=Received(m.lease, m.body),
                past_snapshot=m.message_id not in self._snapshot,
            )
            for m in self._queues[self._dead_letter].receive(limit)
        ]

    async def renew(self, items: Sequence[RedriveItem]) -> None:
        for item in items:
            self._queues[self._dead_letter].extend(item.handle.lease, self.lease_seconds or 0)

    def held_handle(self, item: RedriveItem) -> Received:
        return Received(item.handle.lease, b"")

    async def copy(self, items: Sequence[RedriveItem]) -> Sequence[RedriveItem]:
        for item in items:
            self._queues[self._source].send(item.handle.body)
        return items

    async def remove(self, moved: Sequence[RedriveItem], skipped: Sequence[RedriveItem]) -> None:
        for item in moved:
            self._queues[self._dead_letter].delete(item.handle.lease)

    async def release(self, items: Sequence[RedriveItem]) -> None:
        for item in items:
            self._queues[self._dead_letter].release(item.handle.lease)


# [END redrive]


# [START operations]
async def _count(conn_id: str, queue: str) -> dict[str, Any]:
    """One count of the broker (a real one asks for it: here, the dictionary's size), no receive."""
    config = await MemorySharedStreamHook(conn_id).aget_client_config()
    found = NAMESPACES.get(config.namespace, {}).get(queue)
    if found is None:
        raise MemoryQueueNotFoundError(queue)
    leased = found.count(leased_only=True)
    return {"visible": found.count() - leased, "in_flight": leased, "depth": found.count()}


def queue_depth(conn_id: str, queue: str) -> DepthRead:
    return DepthRead(
        ("memory:" + conn_id, queue, ""), "the depth of a memory queue", lambda: _count(conn_id, queue)
    )


class MemoryOperations(BrokerOperations):
    trigger = MemorySharedStreamTrigger
    hook = MemorySharedStreamHook
    dead_letter_argument = "dead_letter_queue"

    def backlog(self, trigger_kwargs: Mapping[str, Any]) -> Backlog:
        conn_id = self.connection_or_default(trigger_kwargs)
        backlog = {"source": queue_depth(conn_id, trigger_kwargs["queue"])}
        if trigger_kwargs.get("dead_letter_queue"):
            backlog["dead_letter"] = queue_depth(conn_id, trigger_kwargs["dead_letter_queue"])
        return backlog

    def redrive_ends(
        self, upstream: Mapping[str, Any], dead_letter: Any
    ) -> tuple[str | None, str | None] | None:
        return (upstream.get("queue"), dead_letter) if dead_letter else None

    def dead_letter_source(self, **kwargs: Any) -> DeadLetterSource:
        return MemoryDeadLetterSource(**kwargs)


OPERATIONS = MemoryOperations()
# [END operations]
