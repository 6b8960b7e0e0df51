"""
``KafkaSharedStreamTrigger``: watch Kafka topics from an ``AssetWatcher``, at least once.

Every watcher with the same topics (in any order), connection and consumer group shares one
aiokafka consumer in the triggerer; each evaluates its own ``match`` and
``reject`` over the message envelope::

    {"topic": "orders", "partition": 3, "offset": 1742, "timestamp": 1763740000000,
     "key": "customer-17", "value": {"type": "order_created", ...}, "headers": {"source": "web"}}

``value`` is the decoded body (JSON to an object, other UTF-8 text as text); keys and header
values are text, or ``"base64:..."`` when they are not UTF-8. The envelope is the trigger event's
payload, so it lands in ``AssetEvent.extra["payload"]``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Hashable, Sequence
from typing import Any

from airflow.triggers.base import TriggerEvent

from airflow_shared_stream.common.trigger import (
    DEFAULT_MAX_IN_FLIGHT,
    DEFAULT_MAX_PAYLOAD_BYTES,
    SharedStreamTrigger,
)
from airflow_shared_stream.kafka.identity import normalise_topics, producer_shapes, stream_key
from airflow_shared_stream.kafka.producer import KafkaSharedStreamProducer


class KafkaSharedStreamTrigger(SharedStreamTrigger):
    """
    Fire one trigger event per Kafka message this watcher's ``match`` selects.

    :param topics: topic name or names to consume.
    :param kafka_conn_id: Airflow connection of type ``kafka`` (client settings in its extra, in
        librdkafka spelling; see :mod:`airflow_shared_stream.kafka.hook`).
    :param group_id: consumer group, used verbatim. Without one, a stable per-stream id is
        derived from the topics and the connection, prefixed with the connection's ``group.id``
        when it sets one (see :mod:`airflow_shared_stream.kafka.identity`).
    :param match: JMESPath over the envelope; truthy fires a trigger event (``None``: every message).
    :param reject: JMESPath over the envelope; truthy dead-letters the message.
    :param dead_letter_topic: topic that rejected and unprocessable records are produced to before
        their offset is committed past. Without one they are logged and committed past.
    :param max_in_flight: most messages read but not yet settled (the credit window).
    :param max_payload_bytes: larger record values are not turned into trigger events but
        dead-lettered.

    Watchers with the same topics (in any order), connection and ``group_id`` read one stream
    and share one consumer. ``dead_letter_topic``, ``max_in_flight`` and ``max_payload_bytes``
    shape that consumer: they never split the stream or change its group, and a watcher that
    disagrees with the stream's other watchers on one of them fails, naming the argument.
    """

    def __init__(
        self,
        topics: str | Sequence[str],
        kafka_conn_id: str = "kafka_default",
        group_id: str | None = None,
        match: str | None = None,
        reject: str | None = None,
        dead_letter_topic: str | None = None,
        max_in_flight: int = DEFAULT_MAX_IN_FLIGHT,
        max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES,
    ) -> None:
        super().__init__(match=match, reject=reject, max_in_flight=max_in_flight)
        self.topics = normalise_topics(topics)
        self.kafka_conn_id = kafka_conn_id
        self.group_id = group_id
        self.dead_letter_topic = dead_letter_topic
        if max_payload_bytes < 1:
            raise ValueError(f"max_payload_bytes must be positive, got {max_payload_bytes}")
        self.max_payload_bytes = max_payload_bytes

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (
            f"{type(self).__module__}.{type(self).__qualname__}",
            {
                "topics": self.topics,
                "kafka_conn_id": self.kafka_conn_id,
                "group_id": self.group_id,
                "dead_letter_topic": self.dead_letter_topic,
                "max_payload_bytes": self.max_payload_bytes,
                **self._common_kwargs(),
            },
        )

    def shared_stream_key(self) -> Hashable:
        return stream_key(self.topics, self.kafka_conn_id, self.group_id)

    @classmethod
    def create_shared_stream_producer(cls, kwargs: dict[str, Any]) -> KafkaSharedStreamProducer:
        # Built from the first subscriber's kwargs; later watchers are checked against them.
        key = stream_key(kwargs["topics"], kwargs["kafka_conn_id"], kwargs["group_id"])
        return KafkaSharedStreamProducer(
            topics=kwargs["topics"],
            kafka_conn_id=kwargs["kafka_conn_id"],
            group_id=kwargs["group_id"],
            dead_letter_topic=kwargs["dead_letter_topic"],
            max_in_flight=kwargs["max_in_flight"],
            max_payload_bytes=kwargs["max_payload_bytes"],
            stream_key=key,
            shape=kwargs,
        )

    async def filter_shared_stream(self, shared_stream: AsyncIterator[Any]) -> AsyncIterator[TriggerEvent]:
        async for event in super().filter_shared_stream(self._agreeing(shared_stream)):
            yield event

    async def _agreeing(self, shared_stream: AsyncIterator[Any]) -> AsyncIterator[Any]:
        """
        Pass the stream through once this watcher is known to agree with the stream's consumer.

        The consumer exists by the time the first message arrives; a watcher that disagrees on a
        producer-shaping argument fails then (and, when the consumer already runs, at once),
        instead of running silently with another watcher's setting.
        """
        key = self.shared_stream_key()
        kwargs = self.serialize()[1]
        self._refuse_disagreement(key, kwargs)
        checked = False
        async for raw in shared_stream:
            if not checked:
                self._refuse_disagreement(key, kwargs)
                checked = True
            yield raw

    @staticmethod
    def _refuse_disagreement(key: Hashable, kwargs: dict[str, Any]) -> None:
        reason = producer_shapes.disagreement(key, kwargs)
        if reason is not None:
            raise ValueError(f"Kafka watcher of topics {', '.join(kwargs['topics'])}: {reason}")
