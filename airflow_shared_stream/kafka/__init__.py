"""Apache Kafka shared stream on aiokafka: hook (Connection to client), producer, trigger, errors."""

from __future__ import annotations

from airflow_shared_stream.kafka.errors import (
    KafkaAccessError,
    KafkaConfigError,
    KafkaEndpointError,
    KafkaGroupConflictError,
    KafkaSharedStreamError,
    KafkaTopicNotFoundError,
)
from airflow_shared_stream.kafka.hook import KafkaClientConfig, KafkaHook
from airflow_shared_stream.kafka.producer import KafkaSharedStreamProducer
from airflow_shared_stream.kafka.trigger import KafkaSharedStreamTrigger

__all__ = [
    "KafkaAccessError",
    "KafkaClientConfig",
    "KafkaConfigError",
    "KafkaEndpointError",
    "KafkaGroupConflictError",
    "KafkaHook",
    "KafkaSharedStreamError",
    "KafkaSharedStreamProducer",
    "KafkaSharedStreamTrigger",
    "KafkaTopicNotFoundError",
]
