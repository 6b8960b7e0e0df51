"""Azure Service Bus shared stream on ``azure.servicebus.aio`` (peek-lock): hook, producer, trigger."""

from __future__ import annotations

from airflow_shared_stream.servicebus.errors import (
    ServiceBusAccessError,
    ServiceBusConfigurationError,
    ServiceBusEndpointError,
    ServiceBusEntityNotFoundError,
    ServiceBusSharedStreamError,
)
from airflow_shared_stream.servicebus.hook import Entity, ServiceBusClientConfig, ServiceBusSharedStreamHook
from airflow_shared_stream.servicebus.producer import ServiceBusSharedStreamProducer
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
