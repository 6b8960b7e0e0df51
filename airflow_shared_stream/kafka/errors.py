"""
Kafka errors: the common kinds, named for Kafka, and the translation of aiokafka's errors to them.

Messages name topics, servers and the connection id, never a secret: the cause is scrubbed of
the connection's secrets before it becomes part of one.
"""

from __future__ import annotations

import asyncio
from typing import Any

from airflow_shared_stream.common.errors import (
    SecretScrubber,
    SharedStreamAccessError,
    SharedStreamConfigurationError,
    SharedStreamEndpointError,
    SharedStreamError,
    SharedStreamNotFoundError,
)
from airflow_shared_stream.common.renamed import renamed_names


class KafkaSharedStreamError(SharedStreamError, RuntimeError):
    """Base of the errors the Kafka shared stream raises (a ``RuntimeError`` too, as it always was)."""


class KafkaConfigurationError(KafkaSharedStreamError, SharedStreamConfigurationError):
    """The connection's settings or the trigger's arguments cannot drive a safe shared consumer."""


class KafkaGroupConflictError(KafkaConfigurationError):
    """Two different streams asked for one consumer group, which would split their partitions."""


class KafkaTopicNotFoundError(KafkaSharedStreamError, SharedStreamNotFoundError):
    """A topic (or the dead-letter topic) does not exist on the cluster."""


class KafkaAccessError(KafkaSharedStreamError, SharedStreamAccessError):
    """The cluster refused the connection's credentials (SASL) or their permissions."""


class KafkaEndpointError(KafkaSharedStreamError, SharedStreamEndpointError):
    """The bootstrap servers did not answer as Kafka (unreachable, another protocol, TLS mismatch)."""


def _access_refused() -> tuple[type[BaseException], ...]:
    """aiokafka's errors meaning the cluster refused the credentials or their permissions."""
    from aiokafka import errors  # not at import: the hook (and so this module) loads without aiokafka

    return (
        errors.AuthenticationFailedError,
        errors.AuthenticationMethodNotSupported,
        errors.ClusterAuthorizationFailedError,
        errors.GroupAuthorizationFailedError,
        errors.IllegalSaslStateError,
        errors.SaslAuthenticationFailed,
        errors.TopicAuthorizationFailedError,
        errors.UnsupportedSaslMechanismError,
    )


async def login_refusal_behind(client: Any, exc: BaseException) -> BaseException:
    """
    The cluster's refusal of the login behind a failed bootstrap, else ``exc`` itself.

    aiokafka's bootstrap logs each server's connection error and raises only ``KafkaConnectionError``
    ("Unable to bootstrap"), so a refused SASL login would read as an unreachable endpoint. One
    connection per bootstrap server, opened as the bootstrap opened it (``client``: the
    ``AIOKafkaClient`` whose bootstrap failed), gives back the error its SASL handshake raised.
    """
    from aiokafka.conn import create_conn
    from aiokafka.errors import KafkaConnectionError, KafkaError

    if not isinstance(exc, KafkaConnectionError):
        return exc
    for host, port, _ in client.hosts:
        try:
            connection = await create_conn(
                host,
                port,
                client_id=client._client_id,
                request_timeout_ms=client._request_timeout_ms,
                ssl_context=client._ssl_context,
                security_protocol=client._security_protocol,
                sasl_mechanism=client._sasl_mechanism,
                sasl_plain_username=client._sasl_plain_username,
                sasl_plain_password=client._sasl_plain_password,
                sasl_kerberos_service_name=client._sasl_kerberos_service_name,
                sasl_kerberos_domain_name=client._sasl_kerberos_domain_name,
                sasl_oauth_token_provider=client._sasl_oauth_token_provider,
            )
        except _access_refused() as refused:
            return refused
        except (OSError, KafkaError, asyncio.TimeoutError):
            continue
        connection.close()
    return exc


class KafkaErrorTranslator:
    """
    Turn a client error into the stream's error: what failed, the connection id, the cause.

    :attr:`scrubber` holds the connection's secrets once it is read (the producer sets it), so
    the cause's text never carries one.
    """

    def __init__(self, kafka_config_id: str) -> None:
        self.kafka_config_id = kafka_config_id
        self.scrubber = SecretScrubber()

    def __call__(
        self, what: str, exc: BaseException, *, kind: type[KafkaSharedStreamError] = KafkaSharedStreamError
    ) -> KafkaSharedStreamError:
        return kind(f"{what} (connection {self.kafka_config_id!r}): {self.scrubber.describe(exc)}")

    def connect_failed(self, servers: str, exc: BaseException) -> KafkaSharedStreamError:
        """A refused login is an access error; anything else, an endpoint that did not answer."""
        kind = KafkaAccessError if isinstance(exc, _access_refused()) else KafkaEndpointError
        return self(f"cannot connect to Kafka at {servers}", exc, kind=kind)


__getattr__ = renamed_names(__name__, globals(), {"KafkaConfigError": "KafkaConfigurationError"})
