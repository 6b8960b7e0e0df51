"""Amazon SQS shared stream on aiobotocore: hook (Connection to client), producer, trigger."""

from __future__ import annotations

from typing import Any

from airflow_shared_stream.sqs.errors import (
    SqsAccessError,
    SqsConfigurationError,
    SqsEndpointError,
    SqsQueueNotFoundError,
    SqsSharedStreamError,
)
from airflow_shared_stream.sqs.hook import QueueUrl, SqsClientConfig, SqsSharedStreamHook, renamed_hook
from airflow_shared_stream.sqs.producer import SqsSharedStreamProducer
from airflow_shared_stream.sqs.trigger import SqsSharedStreamTrigger

__all__ = [
    "QueueUrl",
    "SqsAccessError",
    "SqsClientConfig",
    "SqsConfigurationError",
    "SqsEndpointError",
    "SqsQueueNotFoundError",
    "SqsSharedStreamError",
    "SqsSharedStreamHook",
    "SqsSharedStreamProducer",
    "SqsSharedStreamTrigger",
]


def __getattr__(name: str) -> Any:
    if name == "SqsHook":
        return renamed_hook()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
