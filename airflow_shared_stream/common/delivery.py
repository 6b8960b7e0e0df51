"""What a leased-queue broker hands the template, and what the template hands back to settle."""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from airflow_shared_stream.common.matching import RawMessage

Handle = TypeVar("Handle")
"""What the broker settles a message with: a receipt handle, an ack id, a received message."""

ACK_QUEUED = RawMessage(envelope={}, label="(message acknowledged, ACK queued)")
"""Stands in for the message of every delivery whose ACK is queued.

Its trigger events are persisted by then and an ACK needs only the handle and the lease, so the
envelope is dropped at once instead of outliving the linger (and garbage-collector generations)
in the ACK queue. Set in place: the manager is done with the delivery. Shared; never changed."""


@dataclass(slots=True, eq=False)
class Delivery(Generic[Handle]):
    """
    One message a broker's ``receive`` returns.

    :param message: what the watchers see, built with :func:`~.matching.build_message`.
    :param handle: what the broker's settlement calls need (receipt handle, ack id, message).
    :param lease: hashable id the lease keeper tracks (receipt handle, ack id, lock token).
    :param lane: ordering key (FIFO group, ordering key, session id), or ``None`` if unordered.
    :param size: body size in bytes as the broker counts it (dead-letter batches are bounded).
    :param message_id: secret-free id for logs and errors.

    Not frozen (a frozen dataclass is slower to build, and one is built per message): only the
    template changes a delivery, replacing its message with :data:`ACK_QUEUED`.
    """

    message: RawMessage
    handle: Handle
    lease: Hashable
    lane: Hashable | None = None
    size: int = 0
    message_id: str = ""


@dataclass(frozen=True, slots=True)
class DeadLetter(Generic[Handle]):
    """
    A message to dead-letter, with why.

    ``reason`` is ``"rejected"`` (a watcher's ``reject`` matched, or its expression failed) or
    ``"unprocessable"`` (undecodable, over ``max_payload_bytes``); ``description`` says which
    watcher or which cause, in one line. Service Bus writes both on the message; SQS and
    Pub/Sub carry them as attributes of the dead-letter copy.
    """

    delivery: Delivery[Handle]
    reason: str
    description: str


@dataclass(eq=False, slots=True)
class InFlight(Generic[Handle]):
    """The broker payload the template yields to the manager with each message (internal)."""

    delivery: Delivery[Handle]
    sequence: int
    advance_lane: Hashable


ReceivedBatch = tuple[int, Sequence[Delivery[Handle]]]
"""What one receive brought, stamped with the count of lane redeliveries when it returned."""


def chunked(
    items: Sequence[Any],
    *,
    max_count: int | None,
    max_bytes: int | None = None,
    size: Callable[[Any], int] = lambda item: 0,
) -> Iterator[list[Any]]:
    """
    Split ``items`` into batches of at most ``max_count`` items and ``max_bytes`` bytes.

    Order is kept. An item larger than ``max_bytes`` on its own gets a batch of its own (the
    broker decides what to do with it); it never makes a batch exceed the limit with others.
    """
    batch: list[Any] = []
    batch_bytes = 0
    for item in items:
        item_bytes = size(item)
        full = max_count is not None and len(batch) >= max_count
        too_big = max_bytes is not None and batch and batch_bytes + item_bytes > max_bytes
        if full or too_big:
            yield batch
            batch, batch_bytes = [], 0
        batch.append(item)
        batch_bytes += item_bytes
    if batch:
        yield batch
