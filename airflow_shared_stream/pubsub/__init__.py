"""Google Cloud Pub/Sub shared stream on google-cloud-pubsub's asyncio clients: hook, producer, trigger."""

from __future__ import annotations

from airflow_shared_stream.common.renamed import renamed_names
from airflow_shared_stream.pubsub.errors import (
    PubSubAccessError,
    PubSubConfigurationError,
    PubSubEndpointError,
    PubSubNotFoundError,
    PubSubSharedStreamError,
)
from airflow_shared_stream.pubsub.hook import PubSubClientConfig, PubSubSharedStreamHook, ResourceName
from airflow_shared_stream.pubsub.trigger import PubSubSharedStreamTrigger

__all__ = [
    "PubSubAccessError",
    "PubSubClientConfig",
    "PubSubConfigurationError",
    "PubSubEndpointError",
    "PubSubNotFoundError",
    "PubSubSharedStreamError",
    "PubSubSharedStreamHook",
    "PubSubSharedStreamProducer",
    "PubSubSharedStreamTrigger",
    "ResourceName",
]

__getattr__ = renamed_names(
    __name__,
    globals(),
    {"PubSubHook": "PubSubSharedStreamHook", "PubSubClientSettings": "PubSubClientConfig"},
    {"PubSubSharedStreamProducer": "airflow_shared_stream.pubsub.producer"},
)
