"""
The topic id and partition count of a stream's topics, in one Metadata request.

A topic deleted and created again keeps its name and gets a new id (KIP-516), and its offsets
start at 0 again: the id is the one sign of it that does not depend on how many records the new
topic already holds. aiokafka's own Metadata request stops at v5, before topic ids (v10), so this
module asks v10 itself, through the stream consumer's client. A broker below v10 answers nothing
here: ids are then unknown and only a log ending below a position shows a new topic.
"""

from __future__ import annotations

import logging
from io import BytesIO
from typing import Any, NamedTuple

from aiokafka.errors import KafkaError
from aiokafka.protocol.api import Request, RequestStruct, Response
from aiokafka.protocol.types import (
    AbstractType,
    Boolean,
    CompactArray,
    CompactString,
    Int16,
    Int32,
    Schema,
    TaggedFields,
)

log = logging.getLogger(__name__)

NO_TOPIC_ID = bytes(16)
"""Kafka's zero UUID: "no id" (a broker that has none, or a request by name)."""


class Uuid(AbstractType[bytes]):
    """Kafka's ``uuid``: 16 bytes."""

    @classmethod
    def encode(cls, value: bytes) -> bytes:
        return value

    @classmethod
    def decode(cls, data: BytesIO) -> bytes:
        return data.read(16)


class TopicMetadataResponse_v10(Response):
    API_KEY = 3
    API_VERSION = 10
    SCHEMA = Schema(
        ("throttle_time_ms", Int32),
        (
            "brokers",
            CompactArray(
                ("node_id", Int32),
                ("host", CompactString("utf-8")),
                ("port", Int32),
                ("rack", CompactString("utf-8")),
                ("tags", TaggedFields),
            ),
        ),
        ("cluster_id", CompactString("utf-8")),
        ("controller_id", Int32),
        (
            "topics",
            CompactArray(
                ("error_code", Int16),
                ("name", CompactString("utf-8")),
                ("topic_id", Uuid),
                ("is_internal", Boolean),
                (
                    "partitions",
                    CompactArray(
                        ("error_code", Int16),
                        ("partition_index", Int32),
                        ("leader_id", Int32),
                        ("leader_epoch", Int32),
                        ("replica_nodes", CompactArray(Int32)),
                        ("isr_nodes", CompactArray(Int32)),
                        ("offline_replicas", CompactArray(Int32)),
                        ("tags", TaggedFields),
                    ),
                ),
                ("topic_authorized_operations", Int32),
                ("tags", TaggedFields),
            ),
        ),
        ("cluster_authorized_operations", Int32),
        ("tags", TaggedFields),
    )


class TopicMetadataRequest_v10(RequestStruct):
    API_KEY = 3
    API_VERSION = 10
    FLEXIBLE_VERSION = True
    RESPONSE_TYPE = TopicMetadataResponse_v10
    SCHEMA = Schema(
        (
            "topics",
            CompactArray(("topic_id", Uuid), ("name", CompactString("utf-8")), ("tags", TaggedFields)),
        ),
        ("allow_auto_topic_creation", Boolean),
        ("include_cluster_authorized_operations", Boolean),
        ("include_topic_authorized_operations", Boolean),
        ("tags", TaggedFields),
    )


class TopicMetadataRequest(Request[TopicMetadataRequest_v10]):
    API_KEY = 3

    def __init__(self, topics: list[str]) -> None:
        self._topics = topics

    def build(self, request_struct_class: type[TopicMetadataRequest_v10]) -> TopicMetadataRequest_v10:
        topics: list[tuple[bytes, str, dict[int, bytes]]] = [(NO_TOPIC_ID, name, {}) for name in self._topics]
        return request_struct_class(topics, False, False, False, {})


class TopicShape(NamedTuple):
    """What the broker says of one topic now."""

    topic_id: str
    """Hex of the id, ``""`` when the broker has none."""
    partitions: int


async def read_topic_shapes(client: Any, topics: list[str]) -> dict[str, TopicShape] | None:
    """
    The id and partition count of each of ``topics`` that exists; ``None`` if the broker cannot
    say (it has no Metadata v10). A client error propagates.
    """
    node = client.get_random_node()
    try:
        response = await client.send(node, TopicMetadataRequest(topics))
    except NotImplementedError:  # the broker's Metadata stops below v10
        return None
    except KafkaError:
        raise
    shapes: dict[str, TopicShape] = {}
    for error_code, name, topic_id, _internal, partitions, _ops, _tags in response.topics:
        if error_code == 0:
            shown = "" if topic_id == NO_TOPIC_ID else topic_id.hex()
            shapes[name] = TopicShape(shown, len(partitions))
    return shapes
