"""
What the Streams page, redrive and the ``shared+kafka`` scheme ask of Kafka.

:class:`~airflow_shared_stream.common.operations.BrokerOperations`, in Kafka's words.

The dead-letter depth is, per partition of the dead-letter topic, its end offset minus the
redrive group's committed offset (the start offset if the redrive group never committed): what
a redrive would still read. The group is never joined, only its committed offsets are read. The
source's lag is not read here: each watcher's producer reports it with the stream's figures
(:mod:`~airflow_shared_stream.common.figures`), from offsets it already holds.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from aiokafka import AIOKafkaConsumer, TopicPartition

from airflow_shared_stream.common.operations import Backlog, BrokerOperations, DepthRead
from airflow_shared_stream.common.redrive import DeadLetterSource
from airflow_shared_stream.kafka.errors import KafkaTopicNotFoundError
from airflow_shared_stream.kafka.hook import KafkaSharedStreamHook
from airflow_shared_stream.kafka.redrive import dead_letter_source, default_group_id, stream_source
from airflow_shared_stream.kafka.trigger import KafkaSharedStreamTrigger


def dead_letter_depth(conn_id: str, topic: str, source: str | None = None) -> DepthRead:
    """``{"depth": n}`` of a dead-letter topic: what a redrive of ``source`` (its stream's topics) reads."""
    return DepthRead(
        ("kafka:" + conn_id, topic, source or ""),
        "a Kafka dead-letter depth",
        lambda: _read_depth(conn_id, topic, source),
    )


async def _read_depth(conn_id: str, topic: str, source: str | None = None) -> dict[str, Any]:
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


class KafkaOperations(BrokerOperations):
    trigger = KafkaSharedStreamTrigger
    hook = KafkaSharedStreamHook
    dead_letter_argument = "dead_letter_topic"
    redrive_options = frozenset({"group_id"})

    def backlog(self, trigger_kwargs: Mapping[str, Any]) -> Backlog | None:
        if not trigger_kwargs.get("dead_letter_topic"):
            return None
        conn_id = self.connection_or_default(trigger_kwargs)
        source = stream_source(trigger_kwargs.get("topics")) or None
        return {"dead_letter": dead_letter_depth(conn_id, trigger_kwargs["dead_letter_topic"], source)}

    def redrive_ends(
        self, upstream: Mapping[str, Any], dead_letter: Any
    ) -> tuple[str | None, str | None] | None:
        """
        Each record goes back to the topic its origin header names, among the stream's own topics
        (``source``: them, comma-separated): a dead-letter topic may be shared, and a grant for
        this stream must not move another stream's dead letters.
        """
        if not dead_letter:
            return None
        return stream_source(upstream.get("topics")) or None, dead_letter

    def dead_letter_source(self, **kwargs: Any) -> DeadLetterSource:
        return dead_letter_source(**kwargs)


OPERATIONS = KafkaOperations()
