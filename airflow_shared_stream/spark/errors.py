"""Errors of the Spark REST path. None carries the connection's token."""

from __future__ import annotations

import httpx


class SparkRestError(Exception):
    """The master's REST API refused or failed a request (never carries the token)."""


class TransientSparkRestError(SparkRestError):
    """A failure worth retrying: connection refused/reset, timeout, HTTP 5xx, master recovering."""


class UnknownSubmissionError(SparkRestError):
    """The master does not know this submission id: polling it again would never end."""


class SparkRestAuthError(SparkRestError):
    """HTTP 401/403: missing, wrong or expired JWS token (a configuration error, not transient)."""


def transport_error(exc: httpx.HTTPError, what: str) -> TransientSparkRestError:
    """A request that never got an answer: worth retrying."""
    # str(exc) names the URL at most; httpx never puts request headers in exception text.
    return TransientSparkRestError(f"Spark master unreachable for {what}: {type(exc).__name__}: {exc}")
