"""Google Cloud Pub/Sub shared stream on google-cloud-pubsub's asyncio clients: hook, producer, trigger."""

from __future__ import annotations

from typing import Any

from airflow_shared_stream.pubsub import hook
from airflow_shared_stream.pubsub.errors import (
    PubSubAccessError,
    PubSubConfigurationError,
    PubSubEndpointError,
    PubSubNotFoundError,
    PubSubSharedStreamError,
)
from airflow_shared_stream.pubsub.hook import PubSubClientConfig, PubSubSharedStreamHook, ResourceName
from airflow_shared_stream.pubsub.producer import PubSubSharedStreamProducer
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

_RENAMED_IN_HOOK = ("PubSubHook", "PubSubClientSettings")


def __getattr__(name: str) -> Any:
    if name in _RENAMED_IN_HOOK:
        return hook.renamed(__name__, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
