"""Azure Service Bus shared stream on ``azure.servicebus.aio`` (peek-lock): hook, producer, trigger."""

from __future__ import annotations

from airflow_shared_stream.common.renamed import renamed_names
from airflow_shared_stream.servicebus.errors import (
    ServiceBusAccessError,
    ServiceBusConfigurationError,
    ServiceBusEndpointError,
    ServiceBusEntityNotFoundError,
    ServiceBusSharedStreamError,
)
from airflow_shared_stream.servicebus.hook import Entity, ServiceBusClientConfig, ServiceBusSharedStreamHook
from airflow_shared_stream.servicebus.trigger import ServiceBusSharedStreamTrigger

__all__ = [
    "Entity",
    "ServiceBusAccessError",
    "ServiceBusClientConfig",
    "ServiceBusConfigurationError",
    "ServiceBusEndpointError",
    "ServiceBusEntityNotFoundError",
    "ServiceBusSharedStreamError",
    "ServiceBusSharedStreamHook",
    "ServiceBusSharedStreamProducer",
    "ServiceBusSharedStreamTrigger",
]

__getattr__ = renamed_names(
    __name__, globals(), {}, {"ServiceBusSharedStreamProducer": "airflow_shared_stream.servicebus.producer"}
)
