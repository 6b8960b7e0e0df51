"""
A whole broker in one file: an in-memory queue with leases, and the four parts of a broker package.

docs/writing-a-broker.rst shows it piece by piece (the ``[START ...]``/``[END ...]`` markers);
tests/integration/contract/test_memory_contract.py runs the shared-stream contract on it, so the
page cannot drift from the code. In a broker package each part is a module of its own: the
identity type and the hook in ``hook.py``, the errors in ``errors.py``, the producer in
``producer.py`` and the trigger in ``trigger.py``.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

from airflow.sdk import BaseHook
from airflow.sdk.exceptions import AirflowNotFoundException

from airflow_shared_stream.common.errors import (
    SharedStreamConfigurationError,
    SharedStreamError,
    SharedStreamNotFoundError,
)
from airflow_shared_stream.common.leased_queue import DeadLetter, Delivery, LeasedQueueProducer
from airflow_shared_stream.common.matching import build_message
from airflow_shared_stream.common.metrics import stream_label
from airflow_shared_stream.common.trigger import (
    DEFAULT_MAX_IN_FLIGHT,
    DEFAULT_MAX_PAYLOAD_BYTES,
    SharedStreamTrigger,
)

# [START broker]
NAMESPACES: dict[str, dict[str, MemoryQueue]] = {}
"""The "broker": queues by name, per namespace (a connection's host names its namespace)."""


@dataclass(eq=False)
class _Stored:
    message_id: str
    body: bytes
    lease: str = ""
    leased_until: float = 0.0


class MemoryQueue:
    """Messages with leases that run out, as an SQS visibility timeout or a Service Bus lock does."""

    def __init__(self, lease_seconds: float) -> None:
        self.lease_seconds = lease_seconds
        self.gone = False
        self._messages: dict[str, _Stored] = {}

    def send(self, body: bytes) -> str:
        if self.gone:
            raise KeyError("the queue was deleted")
        message_id = uuid.uuid4().hex
        self._messages[message_id] = _Stored(message_id, body)
        return message_id

    def receive(self, max_messages: int) -> list[_Stored]:
        """Lease up to ``max_messages`` messages nobody holds (a new lease token each time)."""
        now = asyncio.get_running_loop().time()
        taken = [m for m in self._messages.values() if m.leased_until <= now][:max_messages]
        for message in taken:
            message.lease, message.leased_until = uuid.uuid4().hex, now + self.lease_seconds
        return taken

    def _held(self, lease: str) -> _Stored | None:
        """The message ``lease`` still holds (None once the lease ran out or another took it)."""
        now = asyncio.get_running_loop().time()
        found = [m for m in self._messages.values() if m.lease == lease and m.leased_until > now]
        return found[0] if found else None

    def delete(self, lease: str) -> None:
        if held := self._held(lease):
            del self._messages[held.message_id]

    def release(self, lease: str) -> None:
        if held := self._held(lease):
            held.leased_until = 0.0

    def extend(self, lease: str, seconds: float) -> bool:
        if held := self._held(lease):
            held.leased_until = asyncio.get_running_loop().time() + seconds
        return held is not None

    def count(self, *, leased_only: bool = False) -> int:
        if not leased_only:
            return len(self._messages)
        return len([m for m in self._messages.values() if self._held(m.lease)])

    def message_ids(self) -> set[str]:
        """Every message's id, leased or not (a redrive's snapshot)."""
        return set(self._messages)

    def take_all(self) -> list[bytes]:
        """Remove and return every body (reading a dead-letter queue)."""
        bodies = [m.body for m in self._messages.values()]
        self._messages.clear()
        return bodies


# [END broker]


# [START errors]
class MemorySharedStreamError(SharedStreamError):
    """Base of this broker's errors; each kind below is also one of the common kinds."""


class MemoryConfigurationError(MemorySharedStreamError, SharedStreamConfigurationError):
    """The trigger's arguments or its connection are wrong."""


class MemoryQueueNotFoundError(MemorySharedStreamError, SharedStreamNotFoundError):
    """The queue (or the dead-letter queue) does not exist in the connection's namespace."""


# [END errors]


# [START hook]
@dataclass(frozen=True)
class QueueName:
    """The identity value type: a queue's name, parsed once, refused early when it cannot be one."""

    name: str

    @classmethod
    def parse(cls, value: str, argument: str = "queue") -> QueueName:
        if not isinstance(value, str) or not value or "/" in value:
            raise MemoryConfigurationError(f"{argument}={value!r} is not a queue name")
        return cls(value)


@dataclass(frozen=True)
class MemoryClientConfig:
    """What the client needs, read from the connection; the secret stays out of ``repr``."""

    namespace: str
    token: str = field(repr=False)


class MemorySharedStreamHook(BaseHook):
    """Reads the connection (through the triggerer's secrets backends) into a client config."""

    conn_name_attr = "memory_conn_id"
    default_conn_name = "memory_default"
    conn_type = "generic"
    hook_name = "In-memory broker (example)"

    def __init__(self, memory_conn_id: str = default_conn_name) -> None:
        super().__init__()
        self.memory_conn_id = memory_conn_id

    async def aget_client_config(self) -> MemoryClientConfig:
        try:
            conn = await BaseHook.aget_connection(self.memory_conn_id)
        except AirflowNotFoundException:
            raise MemoryConfigurationError(f"connection {self.memory_conn_id!r} is not defined") from None
        return MemoryClientConfig(namespace=conn.host or "default", token=conn.password or "")


# [END hook]


# [START producer]
class Received(NamedTuple):
    """The settle handle of one delivery: the lease token, and the body for a dead-letter copy."""

    lease: str
    body: bytes


class MemorySharedStreamProducer(LeasedQueueProducer[Received]):
    """The shared consumer: the broker's calls in its own words; the template does the rest."""

    broker = "memory"
    receive_limit = 10  # the most one receive may ask for
    settle_batch_limit = 10  # the most one ack / redeliver / extend call takes

    def __init__(
        self,
        *,
        queue: str,
        memory_conn_id: str,
        dead_letter_queue: str | None,
        max_in_flight: int,
        max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES,
    ) -> None:
        super().__init__(max_in_flight=max_in_flight, stream_label=stream_label(queue))
        self.queue_name = queue
        self.dead_letter_queue_name = dead_letter_queue
        self.memory_conn_id = memory_conn_id
        self.max_payload_bytes = max_payload_bytes
        self._queue: MemoryQueue
        self._dead: MemoryQueue | None = None

    async def connect(self) -> float:
        """Check the queues exist; return the lease one extension grants."""
        config = await MemorySharedStreamHook(self.memory_conn_id).aget_client_config()
        queues = NAMESPACES.get(config.namespace, {})
        for name in filter(None, (self.queue_name, self.dead_letter_queue_name)):
            if name not in queues:
                raise MemoryQueueNotFoundError(f"queue {name!r} does not exist in {config.namespace!r}")
        self._queue = queues[self.queue_name]
        self._dead = queues.get(self.dead_letter_queue_name or "")
        return self._queue.lease_seconds

    async def receive(self, max_messages: int) -> Sequence[Delivery[Received]]:
        taken = self._queue.receive(max_messages)
        if not taken:
            await asyncio.sleep(0.05)  # a real broker long-polls here
        return [
            Delivery(
                message=build_message(
                    m.body,
                    metadata={"message_id": m.message_id, "queue": self.queue_name},
                    label=m.message_id,
                    max_payload_bytes=self.max_payload_bytes,
                ),
                handle=Received(m.lease, m.body),
                lease=m.lease,
                size=len(m.body),
                message_id=m.message_id,
            )
            for m in taken
        ]

    async def ack(self, deliveries: Sequence[Delivery[Received]]) -> None:
        for delivery in deliveries:
            self._queue.delete(delivery.handle.lease)

    async def redeliver(self, deliveries: Sequence[Delivery[Received]]) -> None:
        for delivery in deliveries:
            self._queue.release(delivery.handle.lease)

    async def dead_letter(self, letters: Sequence[DeadLetter[Received]]) -> None:
        if self._dead is None:
            raise MemoryConfigurationError("a watcher rejected a message and no dead_letter_queue is set")
        for letter in letters:
            try:
                self._dead.send(letter.delivery.handle.body)  # the copy first...
            except KeyError:
                name = self.dead_letter_queue_name
                raise MemoryQueueNotFoundError(f"dead-letter queue {name!r} is gone") from None
            self._queue.delete(letter.delivery.handle.lease)  # ...then the original

    async def extend_leases(
        self, deliveries: Sequence[Delivery[Received]], seconds: float
    ) -> Collection[Delivery[Received]]:
        return [d for d in deliveries if not self._queue.extend(d.handle.lease, seconds)]

    async def disconnect(self) -> None:
        """Nothing to close: a real client closes its connection here."""


# [END producer]


# [START trigger]
class MemorySharedStreamTrigger(SharedStreamTrigger):
    """One watcher of a queue; every watcher of the queue shares one producer."""

    broker = "memory"
    identity_fields = ("queue",)  # the stream key: which upstream
    shaping_fields = ("memory_conn_id", "dead_letter_queue")  # watchers of a stream must agree
    producer_class = MemorySharedStreamProducer

    def __init__(
        self,
        queue: str,
        *,
        memory_conn_id: str = MemorySharedStreamHook.default_conn_name,
        dead_letter_queue: str | None = None,
        match: str | None = None,
        reject: str | None = None,
        max_in_flight: int = DEFAULT_MAX_IN_FLIGHT,
        max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES,
    ) -> None:
        super().__init__(
            match=match, reject=reject, max_in_flight=max_in_flight, max_payload_bytes=max_payload_bytes
        )
        self.queue = QueueName.parse(queue).name
        if dead_letter_queue is not None:
            QueueName.parse(dead_letter_queue, "dead_letter_queue")
        self.memory_conn_id = memory_conn_id
        self.dead_letter_queue = dead_letter_queue


# [END trigger]
