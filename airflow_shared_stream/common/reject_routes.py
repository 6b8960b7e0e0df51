"""
Where a stream's rejected messages go, and which of its watchers reject: refuse a reject with nowhere to go.

A message one watcher rejects and another accepts must leave the broker once (dead-lettered):
given back instead, the broker hands it out again and the accepting watcher fires again on every
delivery. A stream that has nowhere to dead-letter (no dead-letter destination given, none
configured on the broker) therefore must not run a watcher with a ``reject`` expression; the
watcher is refused when it starts, before anything is fanned out to it.

Only the producer knows, once connected, whether its stream has somewhere to dead-letter; only
the watchers know whether they reject. Both meet here, per triggerer process
(:mod:`~airflow_shared_stream.common.process_scope`):

* a watcher with a ``reject`` registers while its filter runs (:meth:`RejectRoutes.watching`);
  if the stream is already known to have nowhere to go, it is refused at once, alone. The
  triggerer subscribes a watcher and starts its filter with no suspension point in between, and
  unsubscribes it the same way when the filter fails, so nothing reaches a refused watcher;
* the producer reports its destination when it connects (:meth:`RejectRoutes.opened`). Watchers
  that registered before (a triggerer starting every watcher of a Dag in one pass) were fanned
  nothing yet: with nowhere to go, the producer fails the stream before its first receive,
  naming them, and no message is taken from the broker.
"""

from __future__ import annotations

import contextlib
from collections.abc import Hashable, Iterator
from dataclasses import dataclass, field

from airflow_shared_stream.common.errors import SharedStreamConfigurationError
from airflow_shared_stream.common.process_scope import scoped


class RejectWithNowhereToGoError(SharedStreamConfigurationError):
    """A watcher has a ``reject`` expression and its stream has no dead-letter destination."""


@dataclass
class _Stream:
    destination: str | None = None
    opened_by: object | None = None
    """The producer that reported ``destination`` (``None``: not connected yet)."""
    rejecting: dict[object, str] = field(default_factory=dict)
    """Token -> name of each running watcher with a ``reject`` expression."""


class RejectRoutes:
    """The per-triggerer registry (see the module docstring); use :func:`reject_routes`."""

    def __init__(self) -> None:
        self._streams: dict[Hashable, _Stream] = {}

    @contextlib.contextmanager
    def watching(self, key: Hashable, watcher: str, *, rejects: bool, fix: str) -> Iterator[None]:
        """
        Held while one watcher's filter runs; raises at once if it rejects and cannot.

        :param fix: what to configure so rejects have somewhere to go (named in the error).
        """
        if not rejects:
            yield
            return
        stream = self._streams.setdefault(key, _Stream())
        if stream.opened_by is not None and stream.destination is None:
            raise RejectWithNowhereToGoError(
                f"{watcher} has a reject expression, and its stream {key} has nowhere to "
                f"dead-letter: a rejected message would be handed out again and fire the watchers "
                f"that accepted it again, on every delivery. {fix}"
            )
        token = object()
        stream.rejecting[token] = watcher
        try:
            yield
        finally:
            stream.rejecting.pop(token, None)
            self._forget_if_idle(key)

    def opened(self, key: Hashable, producer: object, destination: str | None, *, fix: str) -> None:
        """
        The stream's producer connected: record where rejects go, or refuse the watchers that reject.

        Raises :class:`RejectWithNowhereToGoError` (the producer fails the stream before its
        first receive) when ``destination`` is ``None`` and a running watcher has a reject.
        """
        stream = self._streams.setdefault(key, _Stream())
        stream.destination, stream.opened_by = destination, producer
        if destination is None and stream.rejecting:
            watchers = ", ".join(sorted(stream.rejecting.values()))
            raise RejectWithNowhereToGoError(
                f"{watchers} of stream {key} reject messages, and the stream has nowhere "
                "to dead-letter: a rejected message would be handed out again and fire the "
                f"watchers that accepted it again, on every delivery. {fix}"
            )

    def closed(self, key: Hashable, producer: object) -> None:
        """The producer is gone (a later one of the same stream reports its own)."""
        stream = self._streams.get(key)
        if stream is not None and stream.opened_by is producer:
            stream.destination, stream.opened_by = None, None
            self._forget_if_idle(key)

    def _forget_if_idle(self, key: Hashable) -> None:
        stream = self._streams.get(key)
        if stream is not None and stream.opened_by is None and not stream.rejecting:
            del self._streams[key]


def reject_routes() -> RejectRoutes:
    """The registry of the running triggerer (a harness's own in tests)."""
    routes: RejectRoutes = scoped("reject_routes", RejectRoutes)
    return routes
