"""
Dead-lettering Kafka records: the copy, its origin headers, and the pointer for a record too large.

A dead letter is produced with the record's key, value and headers plus three origin headers
(``x-shared-stream-topic``/``-partition``/``-offset``), and the broker acknowledges it before the
commit that passes the record is even queued: a failed copy fails the stream, and the record is
read again.

A record too large for the dead-letter topic (the origin headers add a few dozen bytes, so a
record just under the limit that was accepted upstream can be refused here; the dead-letter
topic may also have a lower limit) is replaced by a **pointer**: no value, the key when it is at
most ``POINTER_KEY_LIMIT`` bytes, the origin headers, the reason and the original size. Retrying
the full record would fail the stream on it forever; the pointer lets the stream go on and names
where the original still is (until the source topic's retention removes it).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from typing import Any

from aiokafka import AIOKafkaProducer
from aiokafka.errors import KafkaError, MessageSizeTooLargeError, RecordListTooLargeError
from aiokafka.record.default_records import DefaultRecordBatchBuilder

from airflow_shared_stream.kafka.envelope import KafkaBrokerPayload
from airflow_shared_stream.kafka.errors import KafkaSharedStreamError

log = logging.getLogger(__name__)

ORIGIN_HEADERS = ("x-shared-stream-topic", "x-shared-stream-partition", "x-shared-stream-offset")
REASON_HEADER = "x-shared-stream-dead-letter-reason"
SIZE_HEADER = "x-shared-stream-original-size"
POINTER_KEY_LIMIT = 1024
"""A pointer record keeps the original key only up to this size (the key may be what is large)."""

TOO_LARGE = (MessageSizeTooLargeError, RecordListTooLargeError)
"""Client- or broker-side refusals of a record for its size: retrying the same record never helps."""


class DeadLetterWriter:
    """
    Produce a batch of records to the dead-letter topic and wait until the broker has every one.

    :param describe_error: turns a client error into the stream's error (scrubbed of secrets).
    """

    def __init__(
        self,
        producer: AIOKafkaProducer,
        topic: str,
        describe_error: Callable[[str, BaseException], KafkaSharedStreamError],
    ) -> None:
        self.producer = producer
        self.topic = topic
        self._describe_error = describe_error

    async def write(self, payloads: Sequence[KafkaBrokerPayload]) -> None:
        dlq, topic = self.producer, self.topic
        try:
            deliveries = []
            for payload in payloads:
                headers = [*payload.headers, *origin_headers(payload)]
                try:
                    delivery = await dlq.send(topic, value=payload.value, key=payload.key, headers=headers)
                except TOO_LARGE as exc:  # refused by the client before it was sent
                    delivery = await self._send_pointer(payload, headers, exc)
                deliveries.append((payload, headers, delivery))
            await dlq.flush()
            pointers = []
            for payload, headers, delivery in deliveries:
                try:
                    await delivery
                except TOO_LARGE as exc:  # refused by the broker (its message.max.bytes)
                    pointers.append(await self._send_pointer(payload, headers, exc))
            if pointers:
                await dlq.flush()
                await asyncio.gather(*pointers)
        except KafkaError as exc:
            raise self._describe_error(f"producing to dead-letter topic {topic!r} failed", exc) from None
        log.warning("Dead-lettered %d message(s) to %s", len(payloads), topic)

    async def _send_pointer(
        self, payload: KafkaBrokerPayload, headers: list[tuple[str, bytes]], exc: BaseException
    ) -> asyncio.Future[Any]:
        size = DefaultRecordBatchBuilder.estimate_size_in_bytes(payload.key, payload.value, headers)
        reason = f"record too large for the dead-letter topic ({size} bytes): {type(exc).__name__}"
        log.error(
            "Dead-lettering %s/%d@%d as a pointer record: %s",
            payload.topic,
            payload.partition,
            payload.offset,
            reason,
        )
        key = payload.key if payload.key is None or len(payload.key) <= POINTER_KEY_LIMIT else None
        pointer_headers = [
            *origin_headers(payload),
            (REASON_HEADER, reason.encode()),
            (SIZE_HEADER, str(size).encode()),
        ]
        return await self.producer.send(self.topic, value=None, key=key, headers=pointer_headers)


def origin_headers(payload: KafkaBrokerPayload) -> list[tuple[str, bytes]]:
    """Where a dead-lettered record came from: topic, partition and offset, as headers."""
    origin = (str(payload.topic), str(payload.partition), str(payload.offset))
    return [(name, value.encode()) for name, value in zip(ORIGIN_HEADERS, origin, strict=True)]
