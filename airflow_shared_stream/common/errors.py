"""
The errors every broker raises, and the one way this provider keeps secrets out of them.

Each broker's ``errors.py`` subclasses these kinds (``SqsAccessError(SqsSharedStreamError,
SharedStreamAccessError)``), so a user can catch "any access problem of any stream" or "anything
SQS" alike. Messages name the problem and the place (queue, topic, connection id) and never carry
a credential: broker SDKs quote signed requests, SASL passwords and connection strings in their
exception text, so broker text goes through :class:`SecretScrubber` before it reaches a message
or a log line.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterable

REDACTED = "***"


class SharedStreamError(Exception):
    """Base of every error a shared stream of this provider raises."""


class SharedStreamConfigurationError(SharedStreamError, ValueError):
    """A trigger's arguments or its Airflow connection are wrong; fix them and redeploy."""


class StreamShapeConflictError(SharedStreamConfigurationError):
    """
    A watcher disagrees with the shared consumer of its stream on a producer-shaping argument.

    Watchers of one upstream share one consumer, built from the first watcher's arguments. A
    later watcher that asks for another ``dead_letter_queue_url`` (say) would silently get the
    first one's; it fails instead, naming the argument (see docs/concepts.rst, stream identity).
    """


class SharedStreamNotFoundError(SharedStreamError):
    """The upstream (queue, topic, subscription, entity) does not exist, or is invisible to the connection."""


class SharedStreamAccessError(SharedStreamError):
    """The broker refused the connection's credentials or their permissions."""


class SharedStreamEndpointError(SharedStreamError):
    """The endpoint did not answer as the broker (wrong URL, unreachable, another protocol)."""


class SecretScrubber:
    """
    Remove known secrets from text, and register them with Airflow's secrets masker.

    Every hook builds one from the secrets of the connection it read (passwords, keys, tokens,
    connection strings) and every producer passes broker exception text through
    :meth:`scrub` before putting it into an error message. :meth:`install` also attaches it as
    a :class:`logging.Filter` to the broker SDK's loggers, which log connection details
    themselves; call it when a stream starts, not at import.
    """

    def __init__(self, secrets: Iterable[str | None] = (), *, tell_masker: bool = True) -> None:
        self._secrets: set[str] = set()
        self._tell_masker = tell_masker
        """``False`` for a short-lived client (a depth read): its secrets are dropped with it."""
        self.add(*secrets)

    def add(self, *secrets: str | None) -> None:
        """Remember ``secrets`` (empty and ``None`` ignored) and tell Airflow's masker about them."""
        for secret in secrets:
            if not secret:
                continue
            self._secrets.add(secret)
            if not self._tell_masker:
                continue
            with contextlib.suppress(Exception):  # no masker outside a deployment
                from airflow.sdk.log import mask_secret

                mask_secret(secret)

    def scrub(self, text: str) -> str:
        """``text`` with every known secret replaced by ``***`` (longest first, so no fragment stays)."""
        for secret in sorted(self._secrets, key=len, reverse=True):
            text = text.replace(secret, REDACTED)
        return text

    def describe(self, exc: BaseException) -> str:
        """``"<ExceptionType>: <scrubbed text>"``: what to put after a colon in an error message."""
        return self.scrub(f"{type(exc).__name__}: {exc}")

    def install(self, *logger_names: str) -> None:
        """Scrub every record these loggers emit (idempotent per logger)."""
        for name in logger_names:
            logger = logging.getLogger(name)
            if not any(f is self._filter for f in logger.filters):
                logger.addFilter(self._filter)

    def uninstall(self, *logger_names: str) -> None:
        """Stop scrubbing these loggers' records (a short-lived client's scrubber, once it is closed)."""
        for name in logger_names:
            logger = logging.getLogger(name)
            for found in [f for f in logger.filters if f is self._filter]:
                logger.removeFilter(found)

    def _filter(self, record: logging.LogRecord) -> bool:
        if self._secrets:
            message = record.getMessage()
            scrubbed = self.scrub(message)
            if scrubbed != message:
                record.msg, record.args = scrubbed, None
        return True


def require_sdk(module: str, extra: str) -> None:
    """
    Import a broker SDK's top module, or fail naming the pip extra that installs it.

    Called at the top of a broker package's producer module, so ``from
    airflow_shared_stream.sqs import SqsSharedStreamTrigger`` without aiobotocore says what to
    install instead of failing on the first message. It only finds the SDK, without importing
    it: the triggerer imports a trigger's module on its event loop, and an SDK's first import
    (hundreds of modules) held that loop; the stream imports it in a worker thread
    (:mod:`~airflow_shared_stream.common.off_loop`).
    """
    import importlib.util

    cause: ImportError | None = None
    try:
        found = importlib.util.find_spec(module)
    except ImportError as exc:  # a parent package is missing
        found, cause = None, exc
    if found is None:
        raise ImportError(
            f"{module} is not installed: install the provider's {extra!r} extra "
            f"(pip install 'airflow-shared-stream[{extra}]')"
        ) from cause
