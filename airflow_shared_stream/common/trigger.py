"""
The broker trigger template: a declarative spec from which the shared-stream plumbing is derived.

A broker trigger declares, once, which of its arguments are what:

* ``identity_fields``: the upstream identity (queue; topics; subscription; entity with the
  endpoint that resolves it). Normalised by :meth:`SharedStreamTrigger.stream_identity`, they
  and nothing else form :meth:`~SharedStreamTrigger.shared_stream_key`. Where only the
  connection names the endpoint (a Service Bus connection string), the key holds the endpoint
  the connection resolves to, not the connection id (:class:`ConnectionEndpoints`): two
  connection ids that reach the same entity are one stream.
* ``shaping_fields``: arguments that shape the ONE consumer all watchers of a stream share
  (dead-letter destination, connection, long-poll wait...). ``max_in_flight`` and
  ``max_payload_bytes`` are shaping fields of every broker. Watchers of one stream must agree
  on them: the triggerer builds the producer from the first watcher's arguments, so a second
  watcher that disagrees fails loudly, naming the argument (:class:`StreamShapeConflictError`).
* ``match`` and ``reject`` are the per-watcher fields, common to every broker.

From that the base derives ``serialize()``, ``shared_stream_key()`` and
``create_shared_stream_producer()`` (which calls ``producer_class(**producer_kwargs)``), and
checks agreement when a watcher starts. The stream-identity rule (docs/concepts.rst) is therefore
written here once: tuning arguments never split a stream, and two watchers that read the same
upstream never silently split its messages.

Where the agreement check runs, and why there: Airflow's ``SharedStreamManager`` builds a
stream's producer from the first subscriber's ``serialize()`` kwargs and never looks at a later
subscriber's. The only code of ours that runs for every watcher of a stream, inside the triggerer
process, is ``filter_shared_stream``; an exception raised there fails that watcher's trigger
alone (the triggerer's ``run_trigger`` catches it, fails the trigger and unsubscribes it) and the
shared consumer keeps serving the others. The triggerer calls ``subscribe`` and starts the filter
with no await in between, so the first watcher whose filter starts is the one whose arguments
built the group; the producer factory also records the shape it was built with.
"""

from __future__ import annotations

import importlib
import logging
import warnings
from collections.abc import AsyncIterator, Callable, Hashable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any, ClassVar

from airflow.exceptions import AirflowProviderDeprecationWarning
from airflow.triggers.base import BaseEventTrigger, TriggerEvent
from airflow.triggers.shared_stream import SharedStreamProducer, reject_shared_stream_event

from airflow_shared_stream.common.errors import SharedStreamConfigurationError, StreamShapeConflictError
from airflow_shared_stream.common.figures import figures_stream_id, stream_figures
from airflow_shared_stream.common.flow_control import validate_max_in_flight
from airflow_shared_stream.common.matching import EnvelopeMatcher, RawMessage, Verdict
from airflow_shared_stream.common.off_loop import ImportedOffLoop, imported
from airflow_shared_stream.common.process_scope import scoped

log = logging.getLogger(__name__)

DEFAULT_MAX_IN_FLIGHT = 500
"""Default credit window: below the triggerer's default subscriber queue size (1024)."""

DEFAULT_MAX_PAYLOAD_BYTES = 64 * 1024
"""Largest message body turned into a trigger event; larger ones are dead-lettered.

The payload ends up in ``AssetEvent.extra`` in the metadata database and in every run's
``triggering_asset_events``: it must stay small. Producers check the body's size once per
message, before fan-out.
"""

COMMON_SHAPING_FIELDS: tuple[str, ...] = ("max_in_flight", "max_payload_bytes")
"""Producer-shaping arguments every broker trigger has."""

WATCHER_FIELDS: tuple[str, ...] = ("match", "reject")
"""Arguments that belong to one watcher and may differ between watchers of a stream."""


def validate_max_payload_bytes(max_payload_bytes: int) -> int:
    if isinstance(max_payload_bytes, bool) or not isinstance(max_payload_bytes, int) or max_payload_bytes < 1:
        raise SharedStreamConfigurationError(
            f"max_payload_bytes must be a positive int, got {max_payload_bytes!r}"
        )
    return max_payload_bytes


class _StreamShapes:
    """
    Which producer shape each live stream of this triggerer process was built with.

    One entry per stream key: the normalised shaping values and how many watchers of this
    process currently run on it. The entry goes when its last watcher stops, so a stream that
    is later rebuilt from other arguments (every watcher redeployed) starts afresh.
    """

    @property
    def _shapes(self) -> dict[Hashable, tuple[dict[str, Any], int]]:
        """Per triggerer process (:mod:`.process_scope`): the test harness plays several in one."""
        shapes: dict[Hashable, tuple[dict[str, Any], int]] = scoped("common.stream_shapes", dict)
        return shapes

    def record_producer(self, key: Hashable, shape: Mapping[str, Any]) -> None:
        """The producer of ``key`` was built with ``shape``: that is the truth to agree with."""
        _, watchers = self._shapes.get(key, ({}, 0))
        self._shapes[key] = (dict(shape), watchers)

    def shape_of(self, key: Hashable) -> dict[str, Any] | None:
        entry = self._shapes.get(key)
        return None if entry is None else dict(entry[0])

    @contextmanager
    def watching(
        self,
        key: Hashable,
        shape: Mapping[str, Any],
        trigger_class: type[SharedStreamTrigger],
    ) -> Iterator[None]:
        """Register one watcher of ``key`` with ``shape``; raise if it disagrees with the stream's."""
        existing = self._shapes.get(key)
        if existing is None or existing[1] == 0:
            # First watcher of the stream in this process: its kwargs built (or will build) the
            # group, since the triggerer subscribes and starts the filter with no await between.
            self._shapes[key] = (dict(shape), 0)
        recorded_shape, _ = self._shapes[key]
        trigger_class.check_shape_agrees(recorded_shape, shape)
        self._shapes[key] = (recorded_shape, self._shapes[key][1] + 1)
        try:
            yield
        finally:
            recorded_shape, watchers = self._shapes.get(key, (recorded_shape, 1))
            if watchers <= 1:
                self._shapes.pop(key, None)
            else:
                self._shapes[key] = (recorded_shape, watchers - 1)


stream_shapes = _StreamShapes()
"""The triggerer process's registry of stream shapes (one event loop, no locking needed)."""


class ConnectionEndpoints:
    """
    Resolve a connection id to the endpoint it names, for a stream key; remember the last answer.

    A stream key may read an Airflow Connection (configuration, never the broker): Airflow
    computes the key in the trigger's own task, where synchronous connection access works, and
    the triggerer supervisor, which runs the cross-triggerer check, reads connections from the
    metadata database. One place cannot read them: the manager's poll task, where
    :meth:`SharedStreamTrigger.create_shared_stream_producer` recomputes the key of the watcher
    that has just computed it in its own task. There, and whenever a read fails, the endpoint
    this process last read for the connection stands in. With no answer at all the key falls
    back to the connection id (the stream then fails at start, with the error that says what is
    wrong with the connection).
    """

    def __init__(self) -> None:
        self._last: dict[tuple[str, str], str] = {}

    def resolve(self, broker: str, conn_id: str, read: Callable[[], str]) -> str | None:
        try:
            endpoint = read()
        except Exception as exc:
            known = self._last.get((broker, conn_id))
            if known is None:
                # Our configuration errors are secret-free; anything else is named by type only.
                reason = str(exc) if isinstance(exc, SharedStreamConfigurationError) else type(exc).__name__
                log.warning(
                    "Cannot resolve what connection %r names for a %s stream: %s", conn_id, broker, reason
                )
            return known
        self._last[(broker, conn_id)] = endpoint
        return endpoint

    def clear(self) -> None:
        """Forget every answer (tests: each starts from a process that has read nothing)."""
        self._last.clear()


connection_endpoints = ConnectionEndpoints()
"""This process's record of what each connection id resolved to (see :class:`ConnectionEndpoints`)."""


class _ProducerFromPath:
    """
    ``producer_class`` of a trigger that names its producer by ``producer_path``: reads as the
    class the path names, imported when read (by a test, a subclass deriving its producer), so
    ``Trigger.producer_class`` keeps meaning the stream's producer class.
    """

    def __get__(
        self, instance: object, owner: type[SharedStreamTrigger]
    ) -> type[SharedStreamProducer] | None:
        return owner.resolve_producer_class() if owner.producer_path else None


class SharedStreamTrigger(BaseEventTrigger):
    """
    Base of this provider's broker triggers: declare the spec, get the shared-stream plumbing.

    A broker trigger sets the class attributes below, validates and stores its own arguments in
    ``__init__`` (the upstream identity first and positional, everything else keyword-only),
    and overrides :meth:`stream_identity` / :meth:`normalized_shape` only to normalise::

        class SqsSharedStreamTrigger(SharedStreamTrigger):
            broker = "sqs"
            identity_fields = ("queue_url",)
            shaping_fields = ("aws_conn_id", "region_name", "dead_letter_queue_url", "wait_time_seconds")
            connection_default_fields = frozenset({"region_name"})
            producer_path = "airflow_shared_stream.sqs.producer:SqsSharedStreamProducer"

    The subscriber half is the same for every broker: evaluate ``match``/``reject`` on each
    broadcast message, yield one :class:`TriggerEvent` whose payload is the message envelope
    for a match, and reject unprocessable or rejected messages (with the reason recorded on the
    message, for the dead-letter copy) so the producer dead-letters them.

    :param match: JMESPath expression over the envelope; a truthy result fires a trigger event.
        ``None`` matches every message.
    :param reject: JMESPath expression over the envelope; a truthy result dead-letters the
        message (checked before ``match``).
    :param max_in_flight: credit window of the shared producer: the most messages received and
        not yet settled. At most the triggerer's ``shared_stream_subscriber_queue_size``.
    :param max_payload_bytes: largest body turned into a trigger event; larger messages are
        dead-lettered. Shapes the shared producer, so every watcher of a stream must agree.
    """

    broker: ClassVar[str] = ""
    """Short broker name: the first element of the stream key and the metrics prefix."""
    identity_fields: ClassVar[tuple[str, ...]] = ()
    """Arguments naming the upstream; normalised, they are the stream key."""
    shaping_fields: ClassVar[tuple[str, ...]] = ()
    """Broker-specific arguments shaping the shared consumer (besides COMMON_SHAPING_FIELDS)."""
    connection_default_fields: ClassVar[frozenset[str]] = frozenset()
    """Shaping fields where ``None`` means "as the connection says", and so agrees with any value."""
    producer_class: ClassVar[type[SharedStreamProducer] | None] = _ProducerFromPath()  # type: ignore[assignment]
    """The producer the triggerer builds for the stream, from :meth:`producer_kwargs`. A subclass
    may set it; otherwise it reads as the class ``producer_path`` names, imported when read (the
    triggerer itself never reads it: :meth:`explicit_producer_class`)."""
    producer_path: ClassVar[str] = ""
    """``module:Class`` of the producer when ``producer_class`` is not given: the trigger's module
    then imports neither it nor its broker SDK, and a stream imports them in a worker thread when
    it opens (the triggerer imports a trigger's module on its event loop)."""
    every_triggerer_reads_everything: ClassVar[bool] = False
    """Whether each triggerer running watchers of a stream gets every message (Kafka), or the
    triggerers compete for them (leased queues). With several triggerers on one stream, a
    competing one is reported loudly (:mod:`airflow_shared_stream.placement`, docs/ha.rst)."""

    def __init__(
        self,
        *,
        match: str | None = None,
        reject: str | None = None,
        max_in_flight: int = DEFAULT_MAX_IN_FLIGHT,
        max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES,
    ) -> None:
        super().__init__()
        self.match = match
        self.reject = reject
        self.max_in_flight = validate_max_in_flight(max_in_flight)
        self.max_payload_bytes = validate_max_payload_bytes(max_payload_bytes)
        self._matcher = EnvelopeMatcher(match, reject)

    # -- the spec, and what is derived from it ----------------------------------------------

    @classmethod
    def producer_fields(cls) -> tuple[str, ...]:
        """Every argument the producer is built from: identity, then shaping."""
        return (*cls.identity_fields, *cls.shaping_fields, *COMMON_SHAPING_FIELDS)

    def stream_identity(self) -> tuple[Hashable, ...]:
        """
        The normalised upstream identity. Override to normalise (case, URL forms, sorting).

        Two watchers of the same upstream MUST get equal identities, whatever spelling or
        tuning arguments they use; nothing but the upstream may appear here.
        """
        return tuple(_hashable(getattr(self, name)) for name in self.identity_fields)

    def shared_stream_key(self) -> Hashable:
        if not self.identity_fields:  # pragma: no cover - a broker that has not declared its spec
            raise NotImplementedError(f"{type(self).__name__} declares no identity_fields")
        return (f"airflow_shared_stream.{self.broker}", *self.stream_identity())

    def metrics_stream_name(self) -> str | None:
        """The upstream's name as the stream's producer labels its metrics (read without building it)."""
        return None

    def normalized_shape(self) -> dict[str, Any]:
        """The producer-shaping values, normalised for comparison. Override to normalise."""
        return {name: getattr(self, name) for name in (*self.shaping_fields, *COMMON_SHAPING_FIELDS)}

    def producer_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for ``producer_class``: identity and shaping fields as given."""
        return {name: getattr(self, name) for name in self.producer_fields()}

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (
            f"{type(self).__module__}.{type(self).__qualname__}",
            {**self.producer_kwargs(), **{name: getattr(self, name) for name in WATCHER_FIELDS}},
        )

    @classmethod
    def explicit_producer_class(cls) -> type[SharedStreamProducer] | None:
        """
        The ``producer_class`` a class in the trigger's hierarchy sets, or ``None`` where the
        trigger names its producer by ``producer_path`` (read without importing anything).
        """
        for klass in cls.__mro__:
            if "producer_class" in vars(klass):
                value = vars(klass)["producer_class"]
                return None if isinstance(value, _ProducerFromPath) else value
        return None

    @classmethod
    def resolve_producer_class(cls) -> type[SharedStreamProducer]:
        """``producer_class``, or the class ``producer_path`` names (imported here if need be)."""
        explicit = cls.explicit_producer_class()
        if explicit is not None:
            return explicit
        module, _, name = cls.producer_path.partition(":")
        found: type[SharedStreamProducer] = getattr(importlib.import_module(module), name)
        return found

    @classmethod
    def create_shared_stream_producer(cls, kwargs: dict[str, Any]) -> SharedStreamProducer:
        """
        Build the stream's producer from the first watcher's kwargs (no I/O here).

        Airflow calls this on the runner's event loop: a producer module not imported yet is
        imported in a worker thread when the stream opens (:class:`~.off_loop.ImportedOffLoop`).
        """
        trigger = cls(**kwargs)
        key = trigger.shared_stream_key()
        stream_shapes.record_producer(key, trigger.normalized_shape())

        def build() -> SharedStreamProducer:
            producer = cls.resolve_producer_class()(**trigger.producer_kwargs())
            metrics = getattr(producer, "metrics", None)
            if metrics is not None:  # the console's figures are keyed by the stream, not its label
                metrics.stream_id = figures_stream_id(key)
            return producer

        module = cls.producer_path.partition(":")[0]
        if cls.explicit_producer_class() is None and not imported(module):
            return ImportedOffLoop(module, build)
        return build()

    @classmethod
    def check_shape_agrees(cls, stream_shape: Mapping[str, Any], watcher_shape: Mapping[str, Any]) -> None:
        """Raise :class:`StreamShapeConflictError` naming each argument the watcher disagrees on."""
        conflicts = []
        for name in sorted(set(stream_shape) | set(watcher_shape)):
            stream_value, watcher_value = stream_shape.get(name), watcher_shape.get(name)
            if stream_value == watcher_value:
                continue
            if name in cls.connection_default_fields and (stream_value is None or watcher_value is None):
                continue
            conflicts.append(f"{name}={watcher_value!r} (the stream's consumer uses {stream_value!r})")
        if conflicts:
            raise StreamShapeConflictError(
                f"{cls.__name__} disagrees with the shared consumer of its stream on "
                f"{', '.join(conflicts)}. Watchers of one upstream share one consumer built from "
                "the first watcher's arguments: give every watcher of the stream the same value."
            )

    # -- the subscriber half ----------------------------------------------------------------

    def _common_kwargs(self) -> dict[str, Any]:
        """The watcher fields and ``max_in_flight``, for a trigger that builds ``serialize()`` by hand."""
        return {"match": self.match, "reject": self.reject, "max_in_flight": self.max_in_flight}

    async def filter_shared_stream(self, shared_stream: AsyncIterator[Any]) -> AsyncIterator[TriggerEvent]:
        """
        Match, reject or let go of each message of the stream, for this watcher.

        One generator for the whole filter: every async-generator layer between the manager and
        the triggerer's loop costs each event of each watcher a resume of its own, and this runs
        once per message per watcher. What a watcher holds while it runs (its place in the
        stream's shape check; a Kafka watcher's own position) comes from :meth:`_watching`.
        """
        with self._watching() as passed:
            async for raw in shared_stream:
                message: RawMessage = raw
                if passed is not None and passed(message):
                    continue
                if message.unprocessable is not None:
                    log.error("Rejecting unprocessable message %s: %s", message.label, message.unprocessable)
                    reject_shared_stream_event()
                    continue
                verdict, reason = self._matcher.evaluate(message.envelope)
                if verdict is Verdict.MATCH:
                    yield TriggerEvent(message.envelope)
                elif verdict is Verdict.REJECT:
                    log.warning("Rejecting message %s: %s", message.label, reason)
                    message.rejections.append(f"{self._watcher_name()}: {reason}")
                    reject_shared_stream_event()

    @contextmanager
    def _watching(self) -> Iterator[Callable[[RawMessage], bool] | None]:
        """
        Held while this watcher's filter runs; yields what says a message was already passed.

        Registers the watcher's shape with its stream (a disagreeing watcher fails here, at its
        first message). A broker whose watchers keep positions of their own (Kafka) extends it
        and yields the test that lets go, unevaluated, of what the watcher already handled.
        """
        if not self.identity_fields:
            # A trigger that builds its key by hand has no declared shape to check.
            yield None
            return
        with (
            stream_shapes.watching(self.shared_stream_key(), self.normalized_shape(), type(self)),
            stream_figures.watching(self),
        ):
            yield None

    def _watcher_name(self) -> str:
        trigger_id = getattr(self, "trigger_id", None)
        return f"trigger {trigger_id}" if trigger_id is not None else type(self).__name__

    async def run(self) -> AsyncIterator[TriggerEvent]:
        """
        Refuse to run outside a shared stream.

        These triggers settle messages on the broker only through Airflow's shared-stream ack
        channel; a standalone ``run()`` could not know when a trigger event was persisted and
        would have to choose between losing and duplicating messages. The triggerer only calls
        this when ``shared_stream_key()`` raised, which is a bug worth failing loudly on.
        """
        raise RuntimeError(
            f"{type(self).__name__} runs only as a shared stream in the triggerer "
            "(apache-airflow>=3.3.2); standalone run() is not supported"
        )
        yield  # pragma: no cover - makes this an async generator


def warn_renamed(old: str, new: str, trigger_class: str) -> None:
    """Warn once per call site that a trigger argument was renamed (the old spelling still works)."""
    warnings.warn(
        f"{trigger_class}({old}=...) is deprecated; use {new}=... instead",
        AirflowProviderDeprecationWarning,
        stacklevel=3,
    )


def _hashable(value: Any) -> Hashable:
    if isinstance(value, list | tuple):
        return tuple(_hashable(v) for v in value)
    if isinstance(value, set | frozenset):
        return tuple(sorted(value))
    return value
