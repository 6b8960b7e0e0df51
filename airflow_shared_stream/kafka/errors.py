"""Kafka errors: the common kinds, named for Kafka. Messages name topics and servers, never a secret."""

from __future__ import annotations

from airflow_shared_stream.common.errors import (
    SharedStreamAccessError,
    SharedStreamConfigurationError,
    SharedStreamEndpointError,
    SharedStreamError,
    SharedStreamNotFoundError,
)


class KafkaSharedStreamError(SharedStreamError, RuntimeError):
    """
    Base of the errors the Kafka shared stream raises.

    Also a :class:`RuntimeError`, as it was before the common kinds existed, so code that caught
    that keeps working.
    """


class KafkaConfigError(KafkaSharedStreamError, SharedStreamConfigurationError):
    """The connection's settings or the trigger's arguments cannot drive a safe shared consumer."""


class KafkaGroupConflictError(KafkaConfigError):
    """Two different streams asked for one consumer group, which would split their partitions."""


class KafkaTopicNotFoundError(KafkaSharedStreamError, SharedStreamNotFoundError):
    """A topic (or the dead-letter topic) does not exist on the cluster."""


class KafkaAccessError(KafkaSharedStreamError, SharedStreamAccessError):
    """The cluster refused the connection's credentials (SASL) or their permissions."""


class KafkaEndpointError(KafkaSharedStreamError, SharedStreamEndpointError):
    """The bootstrap servers did not answer as Kafka (unreachable, another protocol, TLS mismatch)."""
