"""Apache Kafka shared stream on aiokafka: hook (Connection to client), producer, trigger, errors."""

from __future__ import annotations

from airflow_shared_stream.common.renamed import renamed_names
from airflow_shared_stream.kafka.errors import (
    KafkaAccessError,
    KafkaConfigurationError,
    KafkaEndpointError,
    KafkaGroupConflictError,
    KafkaSharedStreamError,
    KafkaTopicNotFoundError,
)
from airflow_shared_stream.kafka.hook import KafkaClientConfig, KafkaSharedStreamHook
from airflow_shared_stream.kafka.trigger import KafkaSharedStreamTrigger

__all__ = [
    "KafkaAccessError",
    "KafkaClientConfig",
    "KafkaConfigurationError",
    "KafkaEndpointError",
    "KafkaGroupConflictError",
    "KafkaSharedStreamError",
    "KafkaSharedStreamHook",
    "KafkaSharedStreamProducer",
    "KafkaSharedStreamTrigger",
    "KafkaTopicNotFoundError",
]

__getattr__ = renamed_names(
    __name__,
    globals(),
    {"KafkaHook": "KafkaSharedStreamHook", "KafkaConfigError": "KafkaConfigurationError"},
    {"KafkaSharedStreamProducer": "airflow_shared_stream.kafka.producer"},
)
