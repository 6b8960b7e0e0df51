"""SQS errors: the common kinds, named for SQS, and botocore's errors translated to them.

Messages name the queue and the connection id, never a credential: botocore's error text can quote
the signed request, so only the service's own message reaches one, through the secret scrubber.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from airflow_shared_stream.common.errors import (
    SharedStreamAccessError,
    SharedStreamConfigurationError,
    SharedStreamEndpointError,
    SharedStreamError,
    SharedStreamNotFoundError,
)


class SqsSharedStreamError(SharedStreamError):
    """Base of the errors the SQS shared stream raises."""


class SqsConfigurationError(SqsSharedStreamError, SharedStreamConfigurationError):
    """The trigger's arguments or its Airflow connection are wrong; fix them and redeploy."""


class SqsQueueNotFoundError(SqsSharedStreamError, SharedStreamNotFoundError):
    """The queue does not exist, or the connection's credentials cannot see it."""


class SqsAccessError(SqsSharedStreamError, SharedStreamAccessError):
    """SQS refused the connection's credentials or their permissions."""


class SqsEndpointError(SqsSharedStreamError, SharedStreamEndpointError):
    """The endpoint did not answer as SQS (wrong URL, unreachable, not an SQS API)."""


MISSING_QUEUE_CODES = frozenset(
    {"AWS.SimpleQueueService.NonExistentQueue", "QueueDoesNotExist", "NonExistentQueue"}
)
ACCESS_CODES = frozenset(
    {
        "AccessDenied",
        "AccessDeniedException",
        "ExpiredToken",
        "InvalidAccessKeyId",
        "InvalidClientTokenId",
        "InvalidSecurity",
        "MissingAuthenticationToken",
        "SignatureDoesNotMatch",
        "UnrecognizedClientException",
    }
)


def explain_client_error(
    exc: Exception, *, operation: str, queue_url: str, aws_conn_id: str, scrub: Callable[[str], str]
) -> SqsSharedStreamError:
    """The error a botocore ``ClientError`` stands for, naming the queue and the connection id."""
    response = getattr(exc, "response", {})
    error = response.get("Error", {})
    code = error.get("Code", "Unknown")
    status = response.get("ResponseMetadata", {}).get("HTTPStatusCode")
    if code in MISSING_QUEUE_CODES:
        return SqsQueueNotFoundError(
            f"SQS queue {queue_url} does not exist, or connection {aws_conn_id!r} cannot see it"
        )
    if code in ACCESS_CODES or status in (401, 403):
        # The service's own message can quote the signed request: leave it out.
        return SqsAccessError(
            f"SQS refused connection {aws_conn_id!r} on {operation} for {queue_url} ({code})"
        )
    return SqsSharedStreamError(
        f"SQS {operation} on {queue_url} failed: {code}: {scrub(error.get('Message', ''))}"
    )


def explain_transport_error(exc: Exception, *, operation: str, queue_url: str) -> SqsEndpointError:
    """The error a botocore ``BotoCoreError`` stands for: only its type, never its text."""
    return SqsEndpointError(
        f"SQS {operation} on {queue_url} failed: the endpoint did not answer as SQS ({type(exc).__name__})"
    )


async def call_sqs(
    client: Any,
    operation: str,
    *,
    queue_url: str,
    aws_conn_id: str,
    scrub: Callable[[str], str],
    **params: Any,
) -> dict[str, Any]:
    """Call one SQS operation (``SendMessageBatch``) on an aiobotocore client, its errors translated."""
    from botocore.exceptions import BotoCoreError, ClientError

    method = getattr(client, client_method_name(operation))
    try:
        return await method(**params)
    except ClientError as exc:
        raise explain_client_error(
            exc, operation=operation, queue_url=queue_url, aws_conn_id=aws_conn_id, scrub=scrub
        ) from None
    except BotoCoreError as exc:
        raise explain_transport_error(exc, operation=operation, queue_url=queue_url) from None


def client_method_name(operation: str) -> str:
    """The aiobotocore method of an SQS operation: ``SendMessageBatch`` -> ``send_message_batch``."""
    return "".join(f"_{c.lower()}" if c.isupper() else c for c in operation).lstrip("_")
