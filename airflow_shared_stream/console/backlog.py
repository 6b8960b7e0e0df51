"""
What a broker says is waiting, asked by the api-server directly where that is one cheap call.

Each read uses the stream's own connection, is cached :data:`CACHE_SECONDS` per destination
however many people keep the page open, and takes nothing from the broker (no receive, no lock):

* SQS: ``GetQueueAttributes`` of the source queue (visible, and in flight: received and not yet
  deleted) and of its dead-letter queue.
* Kafka dead-letter topic: per partition, its end offset minus the redrive group's committed
  offset (the start offset if the redrive group never committed): what a redrive would still
  read. The source's lag is not read here: each watcher's producer reports it with the stream's
  figures (:mod:`.figures`), from offsets it already holds.
* Service Bus ``$deadletterqueue``: counted by peeking the sub-queue (a peek neither locks nor
  counts as a delivery), at most :data:`PEEK_LIMIT` messages. The management API's
  ``dead_letter_message_count`` would be one call, but it is a separate HTTPS/ATOM endpoint a
  connection string to an AMQP-only endpoint (an emulator, a test server) does not answer.
* Pub/Sub: not reported. Its backlog is a Cloud Monitoring metric (no emulator has it) and the only
  other count, pulling the dead-letter subscription, would lease its messages.

Errors never reach the page as text: a failed read is reported by its exception's type only,
so nothing the broker echoes back (a signed URL, a key id) can show.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

log = logging.getLogger(__name__)

CACHE_SECONDS = 10.0
TIMEOUT_SECONDS = 5.0

PEEK_LIMIT = 1000
"""A Service Bus dead-letter sub-queue is counted up to this many (shown as "1000+")."""
PEEK_BATCH = 250
NOT_REPORTED = {"not_reported": "Pub/Sub reports backlogs through Cloud Monitoring only"}

_cache: dict[tuple[str, str, str], tuple[float, dict[str, Any]]] = {}


async def _cached(cache_key: tuple[str, str, str], read: Any, what: str) -> dict[str, Any]:
    """``read()``'s answer, at most once per :data:`CACHE_SECONDS`; ``{"error": "<type>"}`` if it fails."""
    cached = _cache.get(cache_key)
    if cached is not None and time.monotonic() - cached[0] < CACHE_SECONDS:
        return cached[1]
    try:
        depth: dict[str, Any] = await asyncio.wait_for(read(), TIMEOUT_SECONDS)
    except Exception as exc:
        log.info("Could not read %s of connection %s: %s", what, cache_key[0], type(exc).__name__)
        depth = {"error": type(exc).__name__}
    _cache[cache_key] = (time.monotonic(), depth)
    return depth


async def sqs_depth(conn_id: str, queue_url: str, region_name: str | None) -> dict[str, Any]:
    """``{"visible": n, "in_flight": n, "depth": n}`` of one queue, or ``{"error": "<type>"}``; cached."""
    return await _cached(
        ("sqs:" + conn_id, queue_url, region_name or ""),
        lambda: _read_sqs_depth(conn_id, queue_url, region_name),
        "the depth of an SQS queue",
    )


async def _read_sqs_depth(conn_id: str, queue_url: str, region_name: str | None) -> dict[str, Any]:
    from aiobotocore.config import AioConfig

    from airflow_shared_stream.sqs.credentials import open_sqs_client
    from airflow_shared_stream.sqs.hook import QueueUrl, SqsSharedStreamHook

    queue = QueueUrl.parse(queue_url)
    config = await SqsSharedStreamHook(conn_id).aget_client_config(region_name=region_name, queue=queue)
    botocore_config = AioConfig(connect_timeout=3, read_timeout=3, retries={"max_attempts": 1})
    async with open_sqs_client(config, botocore_config, on_secrets=lambda _secrets: None) as client:
        answer = await client.get_queue_attributes(
            QueueUrl=queue.url,
            AttributeNames=["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"],
        )
    attributes = answer.get("Attributes", {})
    visible = int(attributes.get("ApproximateNumberOfMessages", 0))
    in_flight = int(attributes.get("ApproximateNumberOfMessagesNotVisible", 0))
    return {"visible": visible, "in_flight": in_flight, "depth": visible + in_flight}


async def kafka_dead_letter_depth(conn_id: str, topic: str, source: str | None = None) -> dict[str, Any]:
    """
    ``{"depth": n}`` of a dead-letter topic: what the page's redrive (of ``source``, the stream's
    topics) would still read; cached.
    """
    return await _cached(
        ("kafka:" + conn_id, topic, source or ""),
        lambda: _read_kafka_depth(conn_id, topic, source),
        "a Kafka dead-letter depth",
    )


async def _read_kafka_depth(conn_id: str, topic: str, source: str | None = None) -> dict[str, Any]:
    from aiokafka import AIOKafkaConsumer, TopicPartition

    from airflow_shared_stream.kafka.errors import KafkaTopicNotFoundError
    from airflow_shared_stream.kafka.hook import KafkaSharedStreamHook
    from airflow_shared_stream.kafka.redrive import default_group_id

    config = await KafkaSharedStreamHook(conn_id).aget_client_config()
    # The redrive's group, never joined (no subscribe): only its committed offsets are read.
    consumer = AIOKafkaConsumer(**config.consumer_kwargs(default_group_id(topic, source)))
    try:
        await consumer.start()  # inside: a start cut short by the timeout still closes the client
        if topic not in await consumer.topics():
            raise KafkaTopicNotFoundError(topic)
        partitions = [TopicPartition(topic, p) for p in sorted(consumer.partitions_for_topic(topic) or ())]
        starts = await consumer.beginning_offsets(partitions)
        ends = await consumer.end_offsets(partitions)
        depth = 0
        for tp in partitions:
            taken = await consumer.committed(tp)
            depth += max(0, ends[tp] - max(starts[tp], taken or 0))
    finally:
        await consumer.stop()
    return {"depth": depth}


async def servicebus_dead_letter_depth(conn_id: str, entity_path: str) -> dict[str, Any]:
    """``{"depth": n}`` of an entity's ``$deadletterqueue`` (``"at_least": True`` past the limit)."""
    return await _cached(
        ("servicebus:" + conn_id, entity_path, ""),
        lambda: _peek_count(conn_id, entity_path),
        "a Service Bus dead-letter depth",
    )


async def _peek_count(conn_id: str, entity_path: str) -> dict[str, Any]:
    from azure.servicebus import ServiceBusSubQueue

    from airflow_shared_stream.servicebus.hook import ServiceBusSharedStreamHook
    from airflow_shared_stream.servicebus.redrive import parse_entity

    entity = parse_entity(entity_path)
    config = await ServiceBusSharedStreamHook(conn_id).aget_client_config()
    async with config.make_client(retry_total=0) as client:
        if entity.queue_name is not None:
            receiver = client.get_queue_receiver(entity.queue_name, sub_queue=ServiceBusSubQueue.DEAD_LETTER)
        else:
            receiver = client.get_subscription_receiver(
                entity.topic_name, entity.subscription_name, sub_queue=ServiceBusSubQueue.DEAD_LETTER
            )
        async with receiver:
            count, next_sequence = 0, 0
            while count < PEEK_LIMIT:
                want = min(PEEK_BATCH, PEEK_LIMIT - count)
                batch = await receiver.peek_messages(max_message_count=want, sequence_number=next_sequence)
                if not batch:
                    break
                count += len(batch)
                next_sequence = max(m.sequence_number or 0 for m in batch) + 1
    return {"depth": count, "at_least": count >= PEEK_LIMIT}


async def broker_backlog(broker: str, trigger_kwargs: dict[str, Any]) -> dict[str, Any] | None:
    """The stream's backlog and dead-letter depth where the broker tells it cheaply, else ``None``."""
    backlog: dict[str, Any] = {"read_at": time.time()}
    if broker == "sqs":
        conn_id = trigger_kwargs.get("aws_conn_id") or "aws_default"
        region = trigger_kwargs.get("region_name")
        backlog["source"] = await sqs_depth(conn_id, trigger_kwargs["queue_url"], region)
        dead_letter_url = trigger_kwargs.get("dead_letter_queue_url")
        if dead_letter_url:
            backlog["dead_letter"] = await sqs_depth(conn_id, dead_letter_url, region)
    elif broker == "kafka":
        if not trigger_kwargs.get("dead_letter_topic"):
            return None
        conn_id = trigger_kwargs.get("kafka_config_id") or "kafka_default"
        from airflow_shared_stream.kafka.redrive import stream_source

        backlog["dead_letter"] = await kafka_dead_letter_depth(
            conn_id, trigger_kwargs["dead_letter_topic"], stream_source(trigger_kwargs.get("topics")) or None
        )
    elif broker == "servicebus":
        conn_id = trigger_kwargs.get("azure_service_bus_conn_id") or "azure_service_bus_default"
        backlog["dead_letter"] = await servicebus_dead_letter_depth(
            conn_id, servicebus_entity_path(trigger_kwargs)
        )
    elif broker == "pubsub":
        if not trigger_kwargs.get("dead_letter_topic"):
            return None
        backlog["dead_letter"] = dict(NOT_REPORTED)
    else:
        return None
    return backlog


def servicebus_entity_path(trigger_kwargs: dict[str, Any]) -> str:
    """``<queue>`` or ``<topic>/Subscriptions/<subscription>``: how a redrive names the entity."""
    if trigger_kwargs.get("queue_name"):
        return str(trigger_kwargs["queue_name"])
    return f"{trigger_kwargs.get('topic_name')}/Subscriptions/{trigger_kwargs.get('subscription_name')}"
