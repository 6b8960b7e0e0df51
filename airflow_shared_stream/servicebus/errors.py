"""
Service Bus errors: the common kinds, named for Service Bus, and the SDK's errors translated.

Messages name the entity, the namespace and the connection id, never a credential: the SDK
quotes connection strings and SAS tokens in some of its exception texts, so its text only reaches
a message through the stream's :class:`~airflow_shared_stream.common.errors.SecretScrubber`.
"""

from __future__ import annotations

import re

from airflow_shared_stream.common.errors import (
    SecretScrubber,
    SharedStreamAccessError,
    SharedStreamConfigurationError,
    SharedStreamEndpointError,
    SharedStreamError,
    SharedStreamNotFoundError,
)

MIN_SDK_VERSION = "7.15.0"
"""The oldest azure-servicebus the stream runs on (the ``servicebus`` extra's floor).

The suite runs against 7.15; 7.14 and older fail against its test server, and on them a message
given back unseen was abandoned and one left on close waited for its lock to run out: each spent
a ``MaxDeliveryCount`` attempt of a message no watcher saw."""

UNAUTHORIZED_STATUS = re.compile(r"(?<![\d.:])401(?!\d)")
"""A 401 status in an SDK error's text: the number alone, not digits of a port or an address
(a refused connection to 127.0.0.1:54011 read as a refused credential)."""


class ServiceBusSharedStreamError(SharedStreamError):
    """Base of the errors the Service Bus shared stream raises."""


class ServiceBusConfigurationError(ServiceBusSharedStreamError, SharedStreamConfigurationError):
    """The trigger's arguments or its Airflow connection are wrong; fix them and redeploy."""


class ServiceBusEntityNotFoundError(ServiceBusSharedStreamError, SharedStreamNotFoundError):
    """The queue, topic or subscription does not exist in the namespace."""


class ServiceBusAccessError(ServiceBusSharedStreamError, SharedStreamAccessError):
    """Service Bus refused the connection's credential (bad key, expired token, no Listen right)."""


class ServiceBusEndpointError(ServiceBusSharedStreamError, SharedStreamEndpointError):
    """The namespace did not answer as Service Bus (unreachable host, wrong port, not AMQP)."""


def explain(
    action: str,
    exc: BaseException,
    *,
    entity: str,
    namespace: str | None,
    conn_id: str,
    scrubber: SecretScrubber,
) -> ServiceBusSharedStreamError:
    """Turn an SDK error into one naming the problem, the entity and the connection; no secret."""
    from azure.servicebus.exceptions import (
        MessagingEntityNotFoundError,
        ServiceBusAuthenticationError,
        ServiceBusAuthorizationError,
        ServiceBusCommunicationError,
        ServiceBusConnectionError,
    )

    where = f"Service Bus entity {entity!r} of namespace {namespace!r}"
    detail = scrubber.describe(exc)
    if (
        isinstance(exc, MessagingEntityNotFoundError)
        or "not-found" in detail
        or "could not be found" in detail
    ):
        return ServiceBusEntityNotFoundError(f"{where} does not exist (connection {conn_id!r}): {detail}")
    if isinstance(
        exc, ServiceBusAuthenticationError | ServiceBusAuthorizationError
    ) or UNAUTHORIZED_STATUS.search(detail):
        return ServiceBusAccessError(
            f"Service Bus refused the credential of connection {conn_id!r} to {action} {where}: {detail}"
        )
    if isinstance(exc, ServiceBusCommunicationError | ServiceBusConnectionError | OSError):
        return ServiceBusEndpointError(
            f"could not {action} {where} through connection {conn_id!r}: the namespace did "
            f"not answer as Service Bus ({detail})"
        )
    if isinstance(exc, ValueError):
        return ServiceBusConfigurationError(f"connection {conn_id!r} cannot {action} {where}: {detail}")
    return ServiceBusSharedStreamError(f"could not {action} {where}: {detail}")


def is_lock_lost(exc: BaseException) -> bool:
    """The message's (or its session's) lock is gone: Service Bus redelivers it, not an error."""
    from azure.servicebus.exceptions import MessageLockLostError, SessionLockLostError

    if isinstance(exc, MessageLockLostError | SessionLockLostError):
        return True
    return "lock-lost" in str(exc) or "lock has expired" in str(exc)


def is_timeout(exc: BaseException) -> bool:
    from azure.servicebus.exceptions import OperationTimeoutError

    return isinstance(exc, OperationTimeoutError)


def require_sdk_version(installed: str) -> None:
    """Refuse an azure-servicebus older than :data:`MIN_SDK_VERSION`, naming both versions."""
    from packaging.version import Version

    if Version(installed) < Version(MIN_SDK_VERSION):
        raise ImportError(
            f"azure-servicebus {installed} is installed; the Service Bus shared stream needs "
            f"{MIN_SDK_VERSION} or later (on older versions a message no watcher saw spends a "
            f"delivery attempt when it is given back): pip install 'azure-servicebus>={MIN_SDK_VERSION}'"
        )
