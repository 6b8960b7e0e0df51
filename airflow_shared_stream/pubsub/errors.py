"""
Pub/Sub errors: the common kinds, named for Pub/Sub, and Google's errors translated.

Messages name the resource, the connection id and the endpoint, never a credential: the
service's own text is scrubbed of the connection's key material before it is quoted.
"""

from __future__ import annotations

from airflow_shared_stream.common.errors import (
    SecretScrubber,
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


def explain(
    exc: BaseException,
    operation: str,
    resource: str,
    *,
    conn_id: str,
    endpoint: str,
    emulator: bool,
    rpc_timeout: float,
    scrubber: SecretScrubber,
) -> PubSubSharedStreamError:
    """Turn a google.api_core / google.auth error into one of ours; never quotes a credential."""
    from google.api_core import exceptions
    from google.auth.exceptions import GoogleAuthError

    where = f"Pub/Sub {operation} on {resource} (connection {conn_id!r}, endpoint {endpoint})"
    if isinstance(exc, exceptions.RetryError):
        exc = exc.cause or exc
    if isinstance(exc, exceptions.NotFound):
        kind = "topic" if "/topics/" in resource else "subscription"
        return PubSubNotFoundError(
            f"{where} failed: the {kind} does not exist, or the connection's credentials cannot see it"
        )
    if isinstance(exc, exceptions.PermissionDenied | exceptions.Unauthenticated | GoogleAuthError):
        return PubSubAccessError(
            f"{where} failed: Pub/Sub refused the connection's credentials ({type(exc).__name__}); "
            "check the key and its roles (roles/pubsub.subscriber, and roles/pubsub.publisher "
            "on a dead_letter_topic)"
        )
    if isinstance(exc, exceptions.ServiceUnavailable | exceptions.DeadlineExceeded | exceptions.RetryError):
        hint = " Is the emulator running?" if emulator else ""
        return PubSubEndpointError(
            f"{where} failed: the endpoint did not answer within {rpc_timeout:.0f}s "
            f"({type(exc).__name__}).{hint}"
        )
    if isinstance(exc, exceptions.InvalidArgument | exceptions.FailedPrecondition):
        message = scrubber.scrub(str(getattr(exc, "message", "") or exc))
        return PubSubConfigurationError(f"{where} was refused: {message}")
    if isinstance(exc, exceptions.GoogleAPICallError):
        message = scrubber.scrub(str(getattr(exc, "message", "") or exc))
        return PubSubSharedStreamError(f"{where} failed: {type(exc).__name__}: {message}")
    return PubSubSharedStreamError(f"{where} failed: {type(exc).__name__}: {scrubber.scrub(str(exc))}")


NOWHERE_TO_DEAD_LETTER_FIX = "Give the trigger a dead_letter_topic or the subscription a dead-letter policy."
