"""Pub/Sub errors: the common kinds, named for Pub/Sub. Messages name the resource, never a credential."""

from __future__ import annotations

from airflow_shared_stream.common.errors import (
    SharedStreamAccessError,
    SharedStreamConfigurationError,
    SharedStreamEndpointError,
    SharedStreamError,
    SharedStreamNotFoundError,
)


class PubSubSharedStreamError(SharedStreamError):
    """Base of the errors the Pub/Sub shared stream raises."""


class PubSubConfigurationError(PubSubSharedStreamError, SharedStreamConfigurationError):
    """The trigger's arguments or its Airflow connection are wrong; fix them and redeploy."""


class PubSubNotFoundError(PubSubSharedStreamError, SharedStreamNotFoundError):
    """The subscription or topic does not exist, or the connection's credentials cannot see it."""


class PubSubAccessError(PubSubSharedStreamError, SharedStreamAccessError):
    """Pub/Sub refused the connection's credentials or their permissions."""


class PubSubEndpointError(PubSubSharedStreamError, SharedStreamEndpointError):
    """The endpoint did not answer as Pub/Sub (emulator not running, unreachable, wrong address)."""
