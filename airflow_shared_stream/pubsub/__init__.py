"""Google Cloud Pub/Sub shared stream on google-cloud-pubsub's asyncio clients: hook, producer, trigger."""

from __future__ import annotations

from airflow_shared_stream.pubsub.errors import (
    PubSubAccessError,
    PubSubConfigurationError,
    PubSubEndpointError,
    PubSubNotFoundError,
    PubSubSharedStreamError,
)
from airflow_shared_stream.pubsub.hook import PubSubClientSettings, PubSubHook, ResourceName
from airflow_shared_stream.pubsub.producer import PubSubSharedStreamProducer
from airflow_shared_stream.pubsub.trigger import PubSubSharedStreamTrigger

__all__ = [
    "PubSubAccessError",
    "PubSubClientSettings",
    "PubSubConfigurationError",
    "PubSubEndpointError",
    "PubSubHook",
    "PubSubNotFoundError",
    "PubSubSharedStreamError",
    "PubSubSharedStreamProducer",
    "PubSubSharedStreamTrigger",
    "ResourceName",
]
