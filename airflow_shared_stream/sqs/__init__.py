"""Amazon SQS shared stream on aiobotocore: hook (Connection to client), producer, trigger."""

from __future__ import annotations

from airflow_shared_stream.common.renamed import renamed_names
from airflow_shared_stream.sqs.errors import (
    SqsAccessError,
    SqsConfigurationError,
    SqsEndpointError,
    SqsQueueNotFoundError,
    SqsSharedStreamError,
)
from airflow_shared_stream.sqs.hook import QueueUrl, SqsClientConfig, SqsSharedStreamHook
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


__getattr__ = renamed_names(
    __name__,
    globals(),
    {"SqsHook": "SqsSharedStreamHook"},
    {"SqsSharedStreamProducer": "airflow_shared_stream.sqs.producer"},
)
