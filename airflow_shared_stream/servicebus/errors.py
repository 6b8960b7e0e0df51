"""
Service Bus errors: the common kinds, named for Service Bus.

Messages name the entity, the namespace and the connection id, never a credential: the SDK
quotes connection strings and SAS tokens in some of its exception texts, so its text only reaches
a message through the hook's :class:`~airflow_shared_stream.common.errors.SecretScrubber`.
"""

from __future__ import annotations

from airflow_shared_stream.common.errors import (
    SharedStreamAccessError,
    SharedStreamConfigurationError,
    SharedStreamEndpointError,
    SharedStreamError,
    SharedStreamNotFoundError,
)


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
