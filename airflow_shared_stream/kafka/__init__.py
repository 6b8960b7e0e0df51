"""Apache Kafka shared stream on aiokafka: hook (Connection to client), producer, trigger, errors."""

from __future__ import annotations

import warnings
from typing import Any

from airflow.exceptions import AirflowProviderDeprecationWarning

from airflow_shared_stream.kafka.errors import (
    KafkaAccessError,
    KafkaConfigurationError,
    KafkaEndpointError,
    KafkaGroupConflictError,
    KafkaSharedStreamError,
    KafkaTopicNotFoundError,
)
from airflow_shared_stream.kafka.hook import KafkaClientConfig, KafkaSharedStreamHook
from airflow_shared_stream.kafka.producer import KafkaSharedStreamProducer
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

_RENAMED = {"KafkaHook": "KafkaSharedStreamHook", "KafkaConfigError": "KafkaConfigurationError"}


def __getattr__(name: str) -> Any:
    if name in _RENAMED:
        new = _RENAMED[name]
        warnings.warn(
            f"{__name__}.{name} is deprecated; use {new}",
            AirflowProviderDeprecationWarning,
            stacklevel=2,
        )
        return globals()[new]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
