"""
Dead-lettering Kafka records: the copy, its origin headers, and the pointer for a record too large.

A dead letter is produced with the record's key, value and headers plus three origin headers
(``x-shared-stream-topic``/``-partition``/``-offset``), and the broker acknowledges it before the
commit that passes the record is even queued: a failed copy fails the stream, and the record is
read again.

Writes are sized to the dead-letter topic's own limit: its ``max.message.bytes``, read when the
stream starts (:func:`dead_letter_limit`), bounds the producer's batches and requests
(:func:`sized_producer_kwargs`), so records that fit the topic are never refused for being packed
together into one batch that does not.

A record too large for the dead-letter topic (the origin headers add a few dozen bytes, so a
record just under the limit that was accepted upstream can be refused here; the dead-letter
topic may also have a lower limit), one the client refuses for any other reason of its own, or
one the broker refuses for what it is (``RECORD_REFUSED``: a compacted topic refuses a record
without a key with ``INVALID_RECORD``) is replaced by a **pointer**. A batch the broker refuses
whole for one record is first sent again one record at a time, so its neighbours are copied
whole. The pointer has no value; its key is the record's when at most ``POINTER_KEY_LIMIT`` bytes
and it fits the topic's limit, else the origin ``topic/partition/offset`` (a compacted topic needs
a key, and keeps one record per key), else an empty one; then the origin headers, the reason and
the original size. Retrying the full record would fail the stream on it forever; the pointer lets
the stream go on and names where the original still is (until the source topic's retention
removes it). Only a broker error that is not about the record (the broker is away, say) fails the
stream, and the record is read again.

A compacted dead-letter topic is reported at ERROR when the stream starts: it keeps one dead
letter per key and removes pointers (values of ``None`` are tombstones) after its
``delete.retention.ms``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

from aiokafka import AIOKafkaProducer
from aiokafka.client import AIOKafkaClient
from aiokafka.errors import (
    CorruptRecordException,
    InvalidTimestampError,
    KafkaError,
    MessageSizeTooLargeError,
    RecordListTooLargeError,
    UnknownError,
    for_code,
)
from aiokafka.protocol.admin import DescribeConfigsRequest
from aiokafka.record.default_records import DefaultRecordBatchBuilder

from airflow_shared_stream.kafka.envelope import KafkaBrokerPayload
from airflow_shared_stream.kafka.errors import KafkaSharedStreamError

log = logging.getLogger(__name__)

ORIGIN_HEADERS = ("x-shared-stream-topic", "x-shared-stream-partition", "x-shared-stream-offset")
REASON_HEADER = "x-shared-stream-dead-letter-reason"
SIZE_HEADER = "x-shared-stream-original-size"
POINTER_KEY_LIMIT = 1024
"""A pointer record keeps the original key only up to this size (the key may be what is large)."""

POINTER_EMPTY_KEY = b""
"""The last pointer's key, when even the origin's does not fit the topic: a record needs a key."""
TOO_LARGE = (MessageSizeTooLargeError, RecordListTooLargeError)
"""Client- or broker-side refusals of a record for its size: retrying the same record never helps."""
RECORD_REFUSED = (*TOO_LARGE, CorruptRecordException, InvalidTimestampError, UnknownError)
"""Broker answers about the record itself. aiokafka knows no ``INVALID_RECORD`` (error 87, a keyless
record on a compacted topic): it raises ``UnknownError`` for it, as for any code it does not know."""
TOPIC_RESOURCE = 2
"""``DescribeConfigs`` resource type of a topic."""
TOPIC_LIMIT = "max.message.bytes"
TOPIC_CLEANUP = "cleanup.policy"
DEFAULT_BATCH_SIZE = 16384
DEFAULT_REQUEST_SIZE = 1048576
"""aiokafka's own ``max_batch_size`` and ``max_request_size``."""


async def dead_letter_limit(client: AIOKafkaClient, topic: str) -> int | None:
    """
    The dead-letter topic's ``max.message.bytes`` (the broker's default when it sets none), or
    ``None`` when the broker does not say (the producer's own limits stay then, logged).
    """
    request = DescribeConfigsRequest([(TOPIC_RESOURCE, topic, [TOPIC_LIMIT, TOPIC_CLEANUP])])
    try:
        response = await client.send(client.get_random_node(), request)
        configs: dict[str, str] = {}
        for error_code, _message, _kind, _name, entries in response.resources:
            if error_code:
                raise for_code(error_code)()
            configs.update((name, value) for name, value, *_ in entries if value)
        if "compact" in configs.get(TOPIC_CLEANUP, ""):
            log.error(
                "Dead-letter topic %r has cleanup.policy=compact: it keeps one dead letter per key and "
                "removes pointer records after its delete.retention.ms; use cleanup.policy=delete",
                topic,
            )
        if configs.get(TOPIC_LIMIT):
            return int(configs[TOPIC_LIMIT])
    except (KafkaError, ValueError) as exc:
        log.warning(
            "Cannot read %s of dead-letter topic %r (%s): dead letters are sized to the "
            "producer's own limits, and a batch the topic refuses becomes pointer records",
            TOPIC_LIMIT,
            topic,
            type(exc).__name__,
        )
        return None
    log.warning("The broker does not say the %s of dead-letter topic %r", TOPIC_LIMIT, topic)
    return None


def sized_producer_kwargs(kwargs: dict[str, Any], limit: int | None) -> dict[str, Any]:
    """
    The dead-letter producer's arguments with batches and requests no larger than ``limit``.

    aiokafka packs records into batches of ``max_batch_size`` (16 KiB by default) and the broker
    takes or refuses a batch whole, so a topic whose limit is below the batch size would refuse
    records that fit it one by one. Unchanged when the limit is above both.
    """
    sized = dict(kwargs)
    if limit is None:
        return sized
    for name, default in (("max_batch_size", DEFAULT_BATCH_SIZE), ("max_request_size", DEFAULT_REQUEST_SIZE)):
        if limit < sized.get(name, default):
            sized[name] = limit
    return sized


async def start_dead_letter_producer(kwargs: dict[str, Any], topic: str) -> AIOKafkaProducer:
    """
    Start the dead-letter producer, sized to ``topic``'s own limit (read through its own client).

    Read through a client of its own: a broker that does not know ``DescribeConfigs`` may close
    the connection that asked (Tansu does), which must not be the stream consumer's.
    """
    producer = AIOKafkaProducer(**kwargs)
    try:
        await producer.start()
        sized = sized_producer_kwargs(kwargs, await dead_letter_limit(producer.client, topic))
        if sized == kwargs:
            return producer
        await producer.stop()
        producer = AIOKafkaProducer(**sized)
        await producer.start()
    except BaseException:
        await producer.stop()
        raise
    return producer


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
            refused: list[tuple[KafkaBrokerPayload, BaseException]] = []
            for payload in payloads:
                headers = [*payload.headers, *origin_headers(payload)]
                try:
                    delivery = await dlq.send(topic, value=payload.value, key=payload.key, headers=headers)
                except TOO_LARGE as exc:  # refused by the client before it was sent
                    refused.append((payload, exc))
                    continue
                except KafkaError:
                    raise
                except Exception as exc:  # the client's own checks refuse this record: for good
                    refused.append((payload, exc))
                    continue
                deliveries.append((payload, delivery))
            await dlq.flush()
            for payload, delivery in deliveries:
                try:
                    await delivery
                except RECORD_REFUSED as exc:  # by the broker, for its size or for what it is
                    refused.append((payload, exc))
            for payload, refusal in refused:
                await self._send_alone_or_pointer(payload, refusal)
        except Exception as exc:  # the broker is away, or a client fault: the record is read again
            raise self._describe_error(f"producing to dead-letter topic {topic!r} failed", exc) from None
        log.warning("Dead-lettered %d message(s) to %s", len(payloads), topic)

    async def _send_alone_or_pointer(self, payload: KafkaBrokerPayload, exc: BaseException) -> None:
        """
        Copy ``payload`` again on its own, unless its size was refused, else send its pointer.

        The broker refuses a batch whole when one of its records is refused: the others are
        copied whole on their own.
        """
        if not isinstance(exc, TOO_LARGE):
            headers = [*payload.headers, *origin_headers(payload)]
            try:
                await self._produce(payload.key, payload.value, headers)
                return
            except RECORD_REFUSED as refusal:
                exc = refusal
            except KafkaError:
                raise
            except Exception as refusal:  # the client's own checks
                exc = refusal
        await self._send_pointer(payload, exc)

    async def _produce(
        self, key: bytes | None, value: bytes | None, headers: list[tuple[str, bytes]]
    ) -> None:
        delivery = await self.producer.send(self.topic, value=value, key=key, headers=headers)
        await delivery

    async def _send_pointer(self, payload: KafkaBrokerPayload, exc: BaseException) -> None:
        """
        Produce a pointer for ``payload`` and wait for the broker's answer, smaller each refusal.

        First with the key (when at most ``POINTER_KEY_LIMIT``), then with the origin key, then
        with the origin headers alone, then with an empty key too. A topic that refuses even that
        gets nothing: the record is logged at ERROR and passed, as without a dead-letter topic
        (retrying it would fail the stream on it for ever).
        """
        headers = [*payload.headers, *origin_headers(payload)]
        size = DefaultRecordBatchBuilder.estimate_size_in_bytes(payload.key, payload.value, headers)
        if isinstance(exc, TOO_LARGE):
            reason = f"record too large for the dead-letter topic ({size} bytes): {type(exc).__name__}"
        elif isinstance(exc, KafkaError):
            reason = f"record of {size} bytes refused by the dead-letter topic: {type(exc).__name__}"
        else:
            reason = f"record of {size} bytes refused by the Kafka client: {type(exc).__name__}"
        log.error(
            "Dead-lettering %s/%d@%d as a pointer record: %s",
            payload.topic,
            payload.partition,
            payload.offset,
            reason,
        )
        origin_key = origin_coordinates(payload)
        keep_key = payload.key is not None and len(payload.key) <= POINTER_KEY_LIMIT
        key = payload.key if keep_key and payload.key is not None else origin_key
        pointer_headers = [
            *origin_headers(payload),
            (REASON_HEADER, reason.encode()),
            (SIZE_HEADER, str(size).encode()),
        ]
        attempts = [(key, pointer_headers)]
        if key != origin_key:  # the key may not fit the topic: the pointer goes with the origin's
            attempts.append((origin_key, pointer_headers))
        attempts += [(origin_key, origin_headers(payload)), (POINTER_EMPTY_KEY, origin_headers(payload))]
        for pointer_key, fields in attempts:
            try:
                await self._produce(pointer_key, None, fields)
                return
            except RECORD_REFUSED:  # refused before or after sending: a smaller pointer
                continue
        log.error(
            "Dead-letter topic %r refuses even a pointer record (%s): %s/%d@%d is passed without a "
            "dead letter; it stays in its topic until retention removes it",
            self.topic,
            reason,
            payload.topic,
            payload.partition,
            payload.offset,
        )


def origin_coordinates(payload: KafkaBrokerPayload) -> bytes:
    """A pointer's key when the record's own cannot serve: ``topic/partition/offset``, unique."""
    return f"{payload.topic}/{payload.partition}/{payload.offset}".encode()


def origin_headers(payload: KafkaBrokerPayload) -> list[tuple[str, bytes]]:
    """Where a dead-lettered record came from: topic, partition and offset, as headers."""
    origin = (str(payload.topic), str(payload.partition), str(payload.offset))
    return [(name, value.encode()) for name, value in zip(ORIGIN_HEADERS, origin, strict=True)]
