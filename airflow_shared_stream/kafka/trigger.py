"""
``KafkaSharedStreamTrigger``: watch Kafka topics from an ``AssetWatcher``, at least once.

Every watcher with the same topics (in any order), connection, consumer group and producer
settings shares one aiokafka consumer in the triggerer; each evaluates its own ``match`` and
``reject`` over the message envelope::

    {"topic": "orders", "partition": 3, "offset": 1742, "timestamp": 1763740000000,
     "key": "customer-17", "value": {"type": "order_created", ...}, "headers": {"source": "web"}}

``value`` is the decoded body (JSON to an object, other UTF-8 text as text); keys and header
values are text, or ``"base64:..."`` when they are not UTF-8. The envelope is the trigger event's
payload, so it lands in ``AssetEvent.extra["payload"]``.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import Any

from airflow_shared_stream.common.trigger import (
    DEFAULT_MAX_IN_FLIGHT,
    DEFAULT_MAX_PAYLOAD_BYTES,
    SharedStreamTrigger,
)
from airflow_shared_stream.kafka.producer import KafkaSharedStreamProducer, default_group_id


def _topics(topics: str | Sequence[str]) -> list[str]:
    names = [topics] if isinstance(topics, str) else list(topics)
    if not names or not all(isinstance(t, str) and t.strip() for t in names):
        raise ValueError(f"topics must be a non-empty list of topic names, got {topics!r}")
    return sorted(set(names))


class KafkaSharedStreamTrigger(SharedStreamTrigger):
    """
    Fire one trigger event per Kafka message this watcher's ``match`` selects.

    :param topics: topic name or names to consume.
    :param kafka_conn_id: Airflow connection of type ``kafka`` (client settings in its extra, in
        librdkafka spelling; see :mod:`airflow_shared_stream.kafka.hook`).
    :param group_id: consumer group; overrides the connection's ``group.id``. With neither, a
        stable id derived from this trigger's stream key is used.
    :param match: JMESPath over the envelope; truthy fires a trigger event (``None``: every message).
    :param reject: JMESPath over the envelope; truthy dead-letters the message.
    :param dead_letter_topic: topic that rejected and unprocessable records are produced to before
        their offset is committed past. Without one they are logged and committed past.
    :param max_in_flight: most messages read but not yet settled (the credit window).
    :param max_payload_bytes: larger record values are not turned into trigger events but
        dead-lettered.

    Watchers share a consumer only when every argument except ``match`` and ``reject`` is
    equal. Watchers that name the same explicit ``group_id`` must therefore agree on the other
    arguments too: otherwise they get two consumers in one group, which split the partitions.
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
        self.topics = _topics(topics)
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
        return _stream_key(self.serialize()[1])

    @classmethod
    def create_shared_stream_producer(cls, kwargs: dict[str, Any]) -> KafkaSharedStreamProducer:
        # Built from the first subscriber's kwargs: only fields that are part of the key are used.
        key = _stream_key(kwargs)
        return KafkaSharedStreamProducer(
            topics=kwargs["topics"],
            kafka_conn_id=kwargs["kafka_conn_id"],
            group_id=kwargs["group_id"] or default_group_id(key),
            group_id_is_default=kwargs["group_id"] is None,
            dead_letter_topic=kwargs["dead_letter_topic"],
            max_in_flight=kwargs["max_in_flight"],
            max_payload_bytes=kwargs["max_payload_bytes"],
        )


def _stream_key(kwargs: dict[str, Any]) -> Hashable:
    return (
        "airflow-shared-stream/kafka",
        tuple(sorted(kwargs["topics"])),
        kwargs["kafka_conn_id"],
        kwargs["group_id"],
        kwargs["dead_letter_topic"],
        kwargs["max_in_flight"],
        kwargs["max_payload_bytes"],
    )
