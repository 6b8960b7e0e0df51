"""SQS errors with messages that name the problem and never carry a credential."""

from __future__ import annotations


class SqsSharedStreamError(Exception):
    """Base of the errors the SQS shared stream raises."""


class SqsConfigurationError(SqsSharedStreamError, ValueError):
    """The trigger's arguments or its Airflow connection are wrong; fix them and redeploy."""


class SqsQueueNotFoundError(SqsSharedStreamError):
    """The queue does not exist, or the connection's credentials cannot see it."""


class SqsAccessError(SqsSharedStreamError):
    """SQS refused the connection's credentials or their permissions."""


class SqsEndpointError(SqsSharedStreamError):
    """The endpoint did not answer as SQS (wrong URL, unreachable, not an SQS API)."""
