"""
What the operator features ask of a broker: the Streams page, redrive and the schemes.

Each broker package implements :class:`BrokerOperations` in its ``operations.py`` (one instance,
``OPERATIONS``), and ``airflow_shared_stream/brokers.py`` registers it with one line. The
console, the redrive entry point and ``queues.py`` iterate that registry and name no broker, so a
new broker is its own folder and one registry line (docs/writing-a-broker.rst).

A broker says, in its own words:

* its backlog and dead-letter depth (:meth:`BrokerOperations.backlog`), by the cheapest call the
  service has and never by reading messages; the page caches each count and reports a failure by
  its exception's type only;
* how to open it as a redrive source and destination (:meth:`BrokerOperations.dead_letter_source`,
  the broker's ``redrive.py``), and which ends of a stream a redrive from the page names
  (:meth:`BrokerOperations.redrive_ends`);
* which of its trigger's arguments name the connection and the dead-letter destination;
* its stream identity and label (the trigger's identity fields, and the label its metrics use);
* its trigger, which its common.messaging scheme (``shared+<broker>``, from its registry line)
  resolves to.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from airflow_shared_stream.common.figures import metric_label
from airflow_shared_stream.common.redrive import DeadLetterSource
from airflow_shared_stream.common.trigger import SharedStreamTrigger


@dataclass(frozen=True)
class DepthRead:
    """One count a broker answers in one cheap call; the page caches it by ``cache_key``."""

    cache_key: tuple[str, str, str]
    """``("<broker>:<connection id>", <destination>, <qualifier>)``: secret-free; its first part is logged."""
    what: str
    """What is read, for the log of a failed read (``the depth of an SQS queue``)."""
    read: Callable[[], Awaitable[dict[str, Any]]]
    sdk_modules: tuple[str, ...] = ()
    """SDK modules ``read`` imports on first use: the page imports them first, in a worker thread."""


Backlog = Mapping[str, "DepthRead | dict[str, Any]"]
"""``source`` and/or ``dead_letter``: a count to read, or a fixed answer (``not_reported``)."""


class BrokerOperations(ABC):
    """One broker's answers to the operator features; subclassed once in each ``<broker>/operations.py``."""

    trigger: ClassVar[type[SharedStreamTrigger]]
    """The broker's shared-stream trigger: its ``broker`` names the broker (and its registry line)."""
    hook: ClassVar[Any]
    """The broker's hook: its ``conn_name_attr`` is the trigger argument naming the connection (as
    the official provider names it), its ``default_conn_name`` the connection when none is named."""
    dead_letter_argument: ClassVar[str | None] = None
    """The trigger argument naming the dead-letter destination (``None``: the broker's own)."""
    own_dead_letter: ClassVar[str | None] = None
    """Where the broker itself keeps what a stream that names no destination dead-letters, in words
    for the page (``None``: such a stream dead-letters nowhere)."""
    redrive_options: ClassVar[frozenset[str]] = frozenset()
    """Broker-specific arguments a redrive takes through ``broker_options``."""
    redrive_needs_dead_letter: ClassVar[bool] = True
    """Whether a redrive must be told where the dead letters are (not where the broker keeps them)."""

    @property
    def broker(self) -> str:
        return self.trigger.broker

    @property
    def trigger_path(self) -> str:
        """The trigger's import path (what its scheme resolves to, and its rows' classpath)."""
        return f"{self.trigger.__module__}.{self.trigger.__qualname__}"

    @property
    def connection_argument(self) -> str:
        return str(self.hook.conn_name_attr)

    @property
    def default_connection(self) -> str:
        return str(self.hook.default_conn_name)

    def connection_id(self, trigger: Any) -> str | None:
        """The connection id the trigger names (``None`` when it names none)."""
        return getattr(trigger, self.connection_argument, None)

    def connection_or_default(self, trigger_kwargs: Mapping[str, Any]) -> str:
        return trigger_kwargs.get(self.connection_argument) or self.default_connection

    def dead_letter(self, trigger: Any) -> Any:
        """The dead-letter destination the trigger names (``None``: none, or the broker's own)."""
        return getattr(trigger, self.dead_letter_argument, None) if self.dead_letter_argument else None

    def upstream(self, trigger: Any) -> dict[str, Any]:
        """The stream's identity: the trigger's identity arguments that are set."""
        given = ((name, getattr(trigger, name, None)) for name in trigger.identity_fields)
        return {name: value for name, value in given if value is not None}

    def stream_label(self, trigger: Any) -> str:
        """The stream's display label: the one its metrics use."""
        return metric_label(trigger)

    @abstractmethod
    def backlog(self, trigger_kwargs: Mapping[str, Any]) -> Backlog | None:
        """What the page shows as waiting (``source``, ``dead_letter``), or ``None``: nothing to show."""

    @abstractmethod
    def redrive_ends(
        self, upstream: Mapping[str, Any], dead_letter: Any
    ) -> tuple[str | None, str | None] | None:
        """
        The ``source`` and ``dead_letter`` a redrive of this stream names, from its identity and
        dead-letter destination; ``None`` when the page cannot name both ends.
        """

    @abstractmethod
    def dead_letter_source(
        self,
        *,
        source: str | None,
        dead_letter: str | None,
        conn_id: str | None,
        keep_origin_attributes: bool,
        **options: Any,
    ) -> DeadLetterSource:
        """The broker's redrive source and destination (its ``redrive.py``), built without I/O."""
