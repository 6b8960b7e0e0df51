"""SQS errors: the common kinds, named for SQS. Messages name the queue and never a credential."""

from __future__ import annotations

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
