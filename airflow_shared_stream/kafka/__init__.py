"""Apache Kafka shared stream on aiokafka: hook (Connection to client), producer, trigger."""

from __future__ import annotations

from airflow_shared_stream.kafka.hook import KafkaClientConfig, KafkaConfigError, KafkaHook
from airflow_shared_stream.kafka.producer import KafkaSharedStreamError, KafkaSharedStreamProducer
from airflow_shared_stream.kafka.trigger import KafkaSharedStreamTrigger

__all__ = [
    "KafkaClientConfig",
    "KafkaConfigError",
    "KafkaHook",
    "KafkaSharedStreamError",
    "KafkaSharedStreamProducer",
    "KafkaSharedStreamTrigger",
]
