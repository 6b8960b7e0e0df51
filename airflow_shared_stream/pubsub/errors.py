"""Pub/Sub errors with messages that name the problem and never carry a credential."""

from __future__ import annotations


class PubSubSharedStreamError(Exception):
    """Base of the errors the Pub/Sub shared stream raises."""


class PubSubConfigurationError(PubSubSharedStreamError, ValueError):
    """The trigger's arguments or its Airflow connection are wrong; fix them and redeploy."""


class PubSubNotFoundError(PubSubSharedStreamError):
    """The subscription or topic does not exist, or the connection's credentials cannot see it."""


class PubSubAccessError(PubSubSharedStreamError):
    """Pub/Sub refused the connection's credentials or their permissions."""


class PubSubEndpointError(PubSubSharedStreamError):
    """The endpoint did not answer as Pub/Sub (emulator not running, unreachable, wrong address)."""
