"""
A protocol-level FAKE of Azure Service Bus: a small AMQP 1.0 server for the test suite.

No Service Bus emulator installs on these machines (Microsoft's is a container image), so this
server speaks just enough of the Service Bus AMQP dialect, on python-qpid-proton, for the real
``azure-servicebus`` SDK (``UseDevelopmentEmulator=true`` connection strings: plain AMQP, no
TLS) to send, receive in peek-lock mode and settle against it. It is NOT Service Bus: it is
in-memory, single-node, has no SQL filters, no scheduling, no deferral, no duplicate detection
unless asked (``duplicate_detection_window``), no transactions, no quotas, and its error texts
only imitate the service's. What it does
implement, because the shared stream depends on it:

* ``$cbs`` put-token: any token is accepted, unless the server is given SAS keys, in which case
  the token's HMAC-SHA256 signature is checked and a bad one is refused with 401;
* queues, topics with subscriptions (every message goes to every subscription), dead-letter
  sub-queues ``<entity>/$DeadLetterQueue`` (with ``DeadLetterReason`` and
  ``DeadLetterErrorDescription`` application properties, as the service sets them);
* peek-lock deliveries whose tag is the lock token, with ``x-opt-lock-token``,
  ``x-opt-sequence-number``, ``x-opt-enqueued-time`` and ``x-opt-locked-until`` annotations and
  a header carrying the delivery count (proton omits a count of 0, so the header is encoded
  here), receive-and-delete (pre-settled) deliveries, and ``drain``;
* settlement on the receive link, echoed back as the service does (accepted, ``modified`` for
  abandon, ``rejected`` without an error for dead-letter, ``released``), and refused with
  ``com.microsoft:message-lock-lost`` once the lock has expired;
* ``$management``: ``renew-lock``, ``peek-message``, ``update-disposition``,
  ``renew-session-lock``;
* lock expiry (the message comes back with its delivery count + 1), session lock expiry (a
  session whose lock is not renewed is taken from its receiver, whatever credit its link has:
  the link is detached with ``com.microsoft:session-lock-lost`` and every message locked on it,
  prefetched ones the client never handed out included, comes back with its delivery count + 1,
  as the service team describes the service in FIDELITY.md's row "Service Bus session lock
  expiry"; closing a session receiver returns them uncounted),
  ``max_delivery_count``
  (then it is dead-lettered with ``MaxDeliveryCountExceeded``), the SDK's batch envelope
  (several messages in one transfer) split into messages;
* sessions: a session-enabled entity hands a receive link one session (named in the link's
  ``com.microsoft:session-filter``, or the next one with messages) and delivers only its
  messages, in sequence order;
* ranged dispositions (one disposition naming a first and a last delivery) as AMQP says, or,
  with ``ignore_ranges``, as a broker that applies one only to its first delivery (the others
  stay locked and get no outcome).

The server runs proton's reactor on a thread of the calling process. Its inspection methods
(:meth:`ServiceBusServer.messages`, :meth:`ServiceBusServer.dead_letters`...) read the state
under the same lock the reactor holds, so tests can assert on what the broker holds.
"""

from __future__ import annotations

import base64
import bisect
import codecs
import collections
import contextlib
import copy
import hashlib
import hmac
import itertools
import json
import logging
import os
import re
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

from proton import (
    UNDESCRIBED,
    Array,
    Condition,
    Data,
    Delivery,
    Described,
    Endpoint,
    Link,
    Message,
    Transport,
    symbol,
    timestamp,
    ulong,
)
from proton.reactor import ApplicationEvent, Container, EventInjector

from tests.support.processes import free_port, wait_for_port

log = logging.getLogger(__name__)

DEAD_LETTER_SUFFIX = "/$deadletterqueue"
MANAGEMENT_SUFFIX = "/$management"
SESSION_FILTER = symbol("com.microsoft:session-filter")
SESSION_LOCKED_UNTIL = symbol("com.microsoft:locked-until-utc")
DOTNET_EPOCH_TICKS = 621355968000000000
"""``DateTime(1970-01-01).Ticks``: the SDK reads session lock expiries as .NET ticks."""

_HEADER, _DELIVERY_ANNOTATIONS, _MESSAGE_ANNOTATIONS = 0x70, 0x71, 0x72
_PROPERTIES, _APPLICATION_PROPERTIES, _DATA, _AMQP_VALUE = 0x73, 0x74, 0x75, 0x77
_SECTION_CODES = range(0x70, 0x79)
_SENT_TRANSFER = re.compile(r'-> @transfer\(20\) \[handle=\w+, delivery-id=(\w+), delivery-tag=b"([^"]*)"')
"""A transfer the server sends, in proton's frame trace: its delivery id and tag (proton writes
``"`` and ``\\`` in a tag as ``\\xNN``)."""
_RANGE_DISPOSITION = re.compile(r"<- @disposition\(21\) \[role=true, first=(\w+), last=(\w+)")
"""A disposition from a receiver that names a range of deliveries."""


def _now_ms() -> int:
    return int(time.time() * 1000)


@dataclass
class StoredMessage:
    """
    One message on an entity, with the broker state the service keeps for it.

    ``bare`` is the bare message exactly as the sender encoded it (properties, application
    properties, body, footer): AMQP makes it immutable, so it is forwarded byte for byte and
    only the header and message annotations are the broker's.
    """

    bare: bytes = field(repr=False)
    annotations: dict[Any, Any] = field(repr=False)
    sequence_number: int
    enqueued_time_ms: int
    delivery_count: int = 0
    lock_token: uuid.UUID | None = None
    locked_until_ms: int = 0
    link: Any = field(default=None, repr=False)
    """The proton link that holds the lock (None once settled or released)."""
    released_by: Any = field(default=None, repr=False)
    """The link that last released it: not offered to that link again before its next flow,
    or a client that releases what arrives outside a receive call would spin with the broker."""

    @property
    def message(self) -> Message:
        """The message decoded (for inspection and matching; delivery uses ``bare``)."""
        message = Message()
        message.decode(self.bare)
        message.annotations = dict(self.annotations)
        return message

    @property
    def session_id(self) -> str | None:
        return self.message.group_id

    @property
    def body(self) -> Any:
        """The body: the bytes of its data section(s), or its AMQP value."""
        sections = _sections(self.bare)
        data = [value for code, value, _ in sections if code == _DATA]
        if data:
            return b"".join(data)
        return next((value for code, value, _ in sections if code == _AMQP_VALUE), None)

    @property
    def application_properties(self) -> dict[str, Any]:
        return dict(self.message.properties or {})


@dataclass
class Entity:
    """A queue, a subscription, or a dead-letter sub-queue: somewhere messages wait to be received."""

    path: str
    lock_duration: float = 30.0
    max_delivery_count: int = 10
    requires_session: bool = False
    available: list[StoredMessage] = field(default_factory=list)
    """Messages that may be delivered, kept in sequence-number order."""
    locked: dict[uuid.UUID, StoredMessage] = field(default_factory=dict)
    dead_letter: Entity | None = None
    receivers: list[Any] = field(default_factory=list)
    session_owner: dict[str, Any] = field(default_factory=dict)
    """session id -> the receive link holding its session lock."""
    session_locked_until_ms: dict[str, int] = field(default_factory=dict)
    """session id -> when its session lock runs out (unless renewed)."""
    sequence: Iterator[int] = field(default_factory=lambda: itertools.count(1))

    def enqueue(self, bare: bytes, annotations: dict[Any, Any], *, delivery_count: int = 0) -> StoredMessage:
        stored = StoredMessage(
            bare=bare,
            annotations=annotations,
            sequence_number=next(self.sequence),
            enqueued_time_ms=_now_ms(),
            delivery_count=delivery_count,
        )
        self.available.append(stored)
        return stored

    def make_available(self, stored: StoredMessage) -> None:
        stored.lock_token, stored.link, stored.locked_until_ms = None, None, 0
        stored.released_by = None
        keys = [m.sequence_number for m in self.available]
        self.available.insert(bisect.bisect(keys, stored.sequence_number), stored)


@dataclass
class Topic:
    path: str
    subscriptions: dict[str, Entity] = field(default_factory=dict)


class ServiceBusServer:
    """
    Run the fake on ``127.0.0.1:<port>`` (a free port by default) on a reactor thread.

    :param sas_keys: ``{key name: key}``; when given, put-token checks the SAS signature and
        refuses tokens it cannot verify. ``None`` accepts any token.
    :param management: also answer the namespace's HTTPS/ATOM management endpoint on the same
        port, as the service does (:mod:`tests.support.servicebus_management`); without it the
        server is AMQP-only, as the development emulator's connection string reaches it.
    """

    def __init__(
        self, port: int | None = None, *, sas_keys: dict[str, str] | None = None, management: bool = False
    ) -> None:
        self.port = port or free_port()
        self.sas_keys = sas_keys
        self._front: Any = None
        if management:
            from tests.support.servicebus_management import ManagementFront

            self._front = ManagementFront(self, self.port, free_port())
        self._lock = threading.RLock()
        self._queues: dict[str, Entity] = {}
        self._topics: dict[str, Topic] = {}
        self._handler = _Handler(self)
        self._injector = EventInjector()
        self._container: Container | None = None
        self._acceptor: Any = None
        self._thread: threading.Thread | None = None
        self._stopped_once = False
        self.refused_tokens = 0
        self.manage_keys: set[str] | None = None
        """Key names with ``Manage`` rights, the only ones the management endpoint answers (``None``:
        every key); the others may still send and listen over AMQP, as a SAS rule without Manage."""
        self.lock_lost_settlements = 0
        self.dead_letter_refused: set[str] = set()
        """Entity paths (lower case) whose dead-letter settlements fail (to test that failure path)."""
        self.requests: collections.Counter[str] = collections.Counter()
        """What consumers asked of the namespace, by kind (bench/watchers.py's requests per message):
        ``connection``, ``attach`` (a link), ``receive`` (a flow frame granting credit on a receive
        link), ``settle`` (a disposition frame, which may settle a range of deliveries), ``$cbs
        put-token`` and ``$management <operation>``."""
        self.settled_deliveries = 0
        """Deliveries the clients settled on their links (a range disposition settles many)."""
        self.released_deliveries = 0
        """Deliveries the clients released (given back unprocessed: the SDK does it to a message
        that arrives while no receive call waits, and to what it holds when a receiver closes)."""
        self.locked_deliveries = 0
        """Messages handed out under a peek-lock (each redelivery counts again)."""
        self.completed_deliveries = 0
        """Messages completed (accepted on their link, or ``completed`` through ``$management``)."""
        self.expired_session_locks = 0
        """Session locks that ran out because nobody renewed them."""
        self.session_lock_renewals: collections.Counter[str] = collections.Counter()
        """Session id -> how many times a client renewed its session lock."""
        self.duplicate_detection_window: float | None = None
        """Seconds: when set, a queue or topic takes a sent message whose ``MessageId`` it already
        took within the window as sent (the send succeeds) and drops it, as an entity with
        duplicate detection does on the service (FIDELITY.md)."""
        self.dropped_duplicates = 0
        self._seen_message_ids: dict[str, dict[Any, float]] = {}
        self.max_message_size: int | None = None
        """Bytes advertised as the max-message-size of every send link (a Standard namespace:
        256 KiB): the SDK sizes its batches to it and refuses a batch over it."""
        self.session_lock_renewed_at: dict[str, list[float]] = collections.defaultdict(list)
        """Session id -> when (``time.monotonic()``) each renewal of its session lock was applied."""
        self.session_renewal_delay: dict[str, float] = {}
        """Session id (``"*"``: any) -> seconds a ``renew-session-lock`` request for it waits before
        the server acts on it and answers (a slow network, a stalled connection): the renewal is
        in flight meanwhile."""
        self.ignore_ranges = False
        """Apply a disposition that names a range of deliveries to its first delivery only, as a
        broker that does not implement ranges would: the others stay locked, with no outcome."""

    # -- lifecycle -----------------------------------------------------------------------------

    def start(self, timeout: float = 10.0) -> ServiceBusServer:
        """
        Listen on the port. After :meth:`stop` this starts again on the same port with the same
        entities, messages and locks (a namespace gateway restart): the old connections' links
        are forgotten, their non-session locks run on until settled or expired, as on the service.
        """
        if self._stopped_once:
            self._injector = EventInjector()
            with self._lock:
                for link in list(self._handler.entity_of):
                    self._handler._forget_link(link)
                self._handler.pending_sessions.clear()
                self._handler.deliveries.clear()
        container = Container(self._handler)
        container.allow_insecure_mechs = True
        container.selectable(self._injector)
        amqp_port = self.port if self._front is None else self._front.amqp_port
        self._acceptor = container.listen(f"127.0.0.1:{amqp_port}")
        self._container = container
        self._thread = threading.Thread(target=self._run, name=f"servicebus-fake-{self.port}", daemon=True)
        self._thread.start()
        # Proton listens on a thread of this process: the listener must be ours (tests/support/ports.py).
        wait_for_port(amqp_port, timeout, what="the Service Bus test server (proton)", owner=os.getpid())
        if self._front is not None:
            self._front.start()
        return self

    def _run(self) -> None:
        assert self._container is not None
        try:
            self._container.run()
        except Exception:  # pragma: no cover - a crash must show up in the test log
            log.exception("Service Bus test server crashed")
            raise

    def stop(self, timeout: float = 10.0) -> None:
        if self._thread is None:
            return
        if self._front is not None:
            self._front.stop()
        self._injector.trigger(ApplicationEvent("stop_server"))
        self._thread.join(timeout)
        if self._thread.is_alive():
            raise RuntimeError(f"the Service Bus test server on port {self.port} did not stop")
        self._injector.close()
        self._thread = None
        self._stopped_once = True

    def __enter__(self) -> ServiceBusServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- connection strings ----------------------------------------------------------------------

    def connection_string(self, key_name: str = "RootManageSharedAccessKey", key: str = "fake-key") -> str:
        """A development-emulator connection string for this server (plain AMQP on its port)."""
        return (
            f"Endpoint=sb://127.0.0.1:{self.port};SharedAccessKeyName={key_name};"
            f"SharedAccessKey={key};UseDevelopmentEmulator=true;"
        )

    def connection(self, **kwargs: str) -> dict[str, Any]:
        """An ``azure_service_bus`` Airflow connection (JSON form) for this server."""
        return {"conn_type": "azure_service_bus", "schema": self.connection_string(**kwargs)}

    # -- sending with the real SDK (synchronous, for tests, e2e and the demo) --------------------

    def send(self, entity: str, bodies: list[Any], **properties: Any) -> list[str]:
        """
        Send ``bodies`` (JSON-encoded unless str/bytes) to a queue or topic in one batch, with
        the real SDK; return their message ids. ``properties`` are ServiceBusMessage keyword
        arguments; a callable value is called with the message's index.
        """
        from azure.servicebus import ServiceBusClient, ServiceBusMessage

        messages = []
        for i, body in enumerate(bodies):
            payload = body if isinstance(body, str | bytes) else json.dumps(body)
            kwargs = {k: (v(i) if callable(v) else v) for k, v in properties.items()}
            kwargs.setdefault("message_id", uuid.uuid4().hex)
            messages.append(ServiceBusMessage(payload, **kwargs))
        with ServiceBusClient.from_connection_string(self.connection_string(**self._sdk_key())) as client:
            if entity.lower() in self._topics:
                sender = client.get_topic_sender(entity)
            else:
                sender = client.get_queue_sender(entity)
            with sender:
                for start in range(0, len(messages), 100):
                    sender.send_messages(messages[start : start + 100])
        return [str(m.message_id) for m in messages]

    def _sdk_key(self) -> dict[str, str]:
        """Credentials the server accepts (its first SAS key, if it checks them)."""
        if not self.sas_keys:
            return {}
        key_name, key = next(iter(self.sas_keys.items()))
        return {"key_name": key_name, "key": key}

    # -- entities ------------------------------------------------------------------------------

    def create_queue(
        self,
        name: str | None = None,
        *,
        lock_duration: float = 30.0,
        max_delivery_count: int = 10,
        requires_session: bool = False,
    ) -> str:
        name = name or f"q-{uuid.uuid4().hex[:10]}"
        with self._lock:
            self._queues[name.lower()] = self._new_entity(
                name, lock_duration, max_delivery_count, requires_session
            )
        return name

    def create_topic(self, name: str | None = None) -> str:
        name = name or f"t-{uuid.uuid4().hex[:10]}"
        with self._lock:
            self._topics[name.lower()] = Topic(name)
        return name

    def create_subscription(
        self,
        topic: str,
        name: str | None = None,
        *,
        lock_duration: float = 30.0,
        max_delivery_count: int = 10,
        requires_session: bool = False,
    ) -> str:
        name = name or f"s-{uuid.uuid4().hex[:10]}"
        with self._lock:
            self._topics[topic.lower()].subscriptions[name.lower()] = self._new_entity(
                f"{topic}/Subscriptions/{name}", lock_duration, max_delivery_count, requires_session
            )
        return name

    @staticmethod
    def _new_entity(path: str, lock_duration: float, max_delivery_count: int, sessions: bool) -> Entity:
        entity = Entity(path, lock_duration, max_delivery_count, sessions)
        entity.dead_letter = Entity(path + "/$DeadLetterQueue", lock_duration, 2**31)
        return entity

    # -- inspection (thread-safe snapshots) -------------------------------------------------------

    def messages(self, path: str) -> list[StoredMessage]:
        """Every message on ``path`` (available and locked), in sequence order; copies."""
        with self._lock:
            entity = self._receivable(path)
            if entity is None:
                raise KeyError(path)
            every = [*entity.available, *entity.locked.values()]
            return sorted((copy.copy(m) for m in every), key=lambda m: m.sequence_number)

    def dead_letters(self, path: str) -> list[StoredMessage]:
        return self.messages(path + "/$DeadLetterQueue")

    def take_dead_letters(self, path: str) -> list[StoredMessage]:
        """Remove and return the available messages of ``path``'s dead-letter sub-queue."""
        with self._lock:
            entity = self._receivable(path + "/$DeadLetterQueue")
            if entity is None:
                raise KeyError(path)
            taken, entity.available = entity.available, []
            return taken

    def refuse_dead_letters(self, path: str) -> None:
        """Fail every dead-letter settlement on ``path`` from now on; the message stays locked."""
        with self._lock:
            self.dead_letter_refused.add(path.lower())

    def counters(self) -> dict[str, int]:
        """What happened to the deliveries so far, by kind (picklable, for a server in a child)."""
        with self._lock:
            return {
                "locked_deliveries": self.locked_deliveries,
                "settled_deliveries": self.settled_deliveries,
                "completed_deliveries": self.completed_deliveries,
                "released_deliveries": self.released_deliveries,
                "lock_lost_settlements": self.lock_lost_settlements,
                "expired_session_locks": self.expired_session_locks,
            }

    def max_delivery_count(self, path: str) -> int:
        """The entity's ``MaxDeliveryCount``, as the server enforces it."""
        with self._lock:
            entity = self._receivable(path)
            if entity is None:
                raise KeyError(path)
            return entity.max_delivery_count

    def locked_count(self, path: str) -> int:
        with self._lock:
            entity = self._receivable(path)
            return len(entity.locked) if entity else 0

    # -- routing (reactor thread, lock held) --------------------------------------------------------

    def _receivable(self, path: str) -> Entity | None:
        key = path.lower()
        dead = key.endswith(DEAD_LETTER_SUFFIX)
        if dead:
            key = key[: -len(DEAD_LETTER_SUFFIX)]
        entity = self._queues.get(key)
        if entity is None and "/subscriptions/" in key:
            topic, _, sub = key.partition("/subscriptions/")
            entity = self._topics.get(topic, Topic(topic)).subscriptions.get(sub)
        if entity is not None and dead:
            return entity.dead_letter
        return entity

    def seen_within_window(self, path: str, bare: bytes) -> bool:
        """Duplicate detection: whether ``path`` took this message's id within the window (then counted)."""
        window = self.duplicate_detection_window
        if window is None:
            return False
        message = Message()
        message.decode(bare)
        if message.id is None:
            return False
        now = time.monotonic()
        seen = self._seen_message_ids.setdefault(path.lower(), {})
        if now - seen.get(message.id, -window - 1.0) <= window:
            self.dropped_duplicates += 1
            return True
        seen[message.id] = now
        return False

    def _sendable(self, path: str) -> list[Entity] | None:
        key = path.lower()
        if key in self._queues:
            return [self._queues[key]]
        if key in self._topics:
            return list(self._topics[key].subscriptions.values())
        return None


def entity_path(address: str | None) -> str:
    """``amqps://host:port/a/b`` or ``a/b`` -> ``a/b``."""
    if not address:
        return ""
    if "://" in address:
        address = urlsplit(address).path
    return address.strip("/")


def _session_renewal_delay(payload: bytes, delays: dict[str, float]) -> float:
    """How long to hold a ``$management`` request (``ServiceBusServer.session_renewal_delay``)."""
    if not delays:
        return 0.0
    request = Message()
    request.decode(payload)
    if (request.properties or {}).get("operation") != "com.microsoft:renew-session-lock":
        return 0.0
    body = request.body if isinstance(request.body, dict) else {}
    session_id = _text(_field(body, "session-id"))
    return float(delays.get(str(session_id), delays.get("*", 0.0)))


def _header_bytes(delivery_count: int, first_acquirer: bool) -> bytes:
    """The AMQP header section with an explicit delivery count (proton drops a count of 0)."""
    data = Data()
    data.put_described()
    data.enter()
    data.put_ulong(_HEADER)
    data.put_list()
    data.enter()
    data.put_bool(False)  # durable
    data.put_ubyte(4)  # priority
    data.put_null()  # ttl
    data.put_bool(first_acquirer)
    data.put_uint(delivery_count)
    data.exit()
    data.exit()
    return data.encode()


def _sections(encoded: bytes) -> list[tuple[int, Any, bytes]]:
    """Split an encoded message into ``(descriptor code, value, raw bytes)`` sections."""
    sections = []
    rest = memoryview(encoded)
    while len(rest):
        data = Data()
        consumed = data.decode(bytes(rest))
        data.rewind()
        data.next()
        value = data.get_object()
        code = int(value.descriptor) if isinstance(value, Described) else -1
        inner = value.value if isinstance(value, Described) else value
        if isinstance(inner, memoryview):  # a view into the Data buffer, freed with ``data``
            inner = bytes(inner)
        sections.append((code, inner, bytes(rest[:consumed])))
        rest = rest[consumed:]
    return sections


def split_batch(encoded: bytes) -> list[bytes]:
    """
    The messages in one transfer. The SDK's batch envelope (message format 0x80013700, which
    proton's Python API does not expose) is a message whose body is data sections that each hold
    one encoded message; it is recognised by that shape. Anything else is a single message.
    """
    sections = _sections(encoded)
    data = [bytes(value) for code, value, _ in sections if code == _DATA]
    if data and all(len(b) > 2 and b[0] == 0 and b[1] == 0x53 and b[2] in _SECTION_CODES for b in data):
        return data
    return [encoded]


def _encode_section(code: int, value: Any) -> bytes:
    data = Data()
    data.put_object(Described(ulong(code), value))
    return data.encode()


def parse_sent(encoded: bytes) -> tuple[bytes, dict[Any, Any]]:
    """A sent message -> (its bare message bytes, its message annotations)."""
    annotations: dict[Any, Any] = {}
    bare = []
    for code, value, raw in _sections(encoded):
        if code == _MESSAGE_ANNOTATIONS:
            annotations = dict(value or {})
        elif code not in (_HEADER, _DELIVERY_ANNOTATIONS):
            bare.append(raw)
    return b"".join(bare), annotations


def with_application_properties(bare: bytes, extra: dict[str, Any]) -> bytes:
    """The bare message with ``extra`` added to its application properties (for dead-lettering)."""
    sections = _sections(bare)
    properties: dict[Any, Any] = {}
    for code, value, _ in sections:
        if code == _APPLICATION_PROPERTIES:
            properties = dict(value or {})
    properties.update(extra)
    before = b"".join(raw for code, _, raw in sections if code == _PROPERTIES)
    after = b"".join(raw for code, _, raw in sections if code not in (_PROPERTIES, _APPLICATION_PROPERTIES))
    return before + _encode_section(_APPLICATION_PROPERTIES, properties) + after


def encode_for_delivery(stored: StoredMessage, *, lock_token: uuid.UUID | None) -> bytes:
    """The message as the service delivers it: header, broker annotations, the bare message."""
    annotations = dict(stored.annotations)
    annotations[symbol("x-opt-sequence-number")] = stored.sequence_number
    annotations[symbol("x-opt-enqueued-time")] = timestamp(stored.enqueued_time_ms)
    if lock_token is not None:
        annotations[symbol("x-opt-lock-token")] = lock_token
        annotations[symbol("x-opt-locked-until")] = timestamp(stored.locked_until_ms)
    return (
        _header_bytes(stored.delivery_count, stored.delivery_count == 0)
        + _encode_section(_MESSAGE_ANNOTATIONS, annotations)
        + stored.bare
    )


class _Handler:
    """Proton core-event handler: the whole protocol side of the fake."""

    def __init__(self, server: ServiceBusServer) -> None:
        self.server = server
        self.entity_of: dict[Any, Entity] = {}
        self.session_of: dict[Any, str] = {}
        self.pending_sessions: list[tuple[Any, Entity, float, str | None]] = []
        self.delayed: list[tuple[float, Any, Entity | None, bytes]] = []
        """Management requests answered later (``ServiceBusServer.session_renewal_delay``)."""
        self.deliveries: dict[Any, StoredMessage] = {}
        self.connections: set[Any] = set()
        # ``ignore_ranges``: per transport, the delivery id of each tag sent, and the ids a
        # ranged disposition named after its first one (not applied).
        self.delivery_ids: dict[Any, dict[bytes, int]] = collections.defaultdict(dict)
        self.ignored_ids: dict[Any, set[int]] = collections.defaultdict(set)

    # -- reactor plumbing -------------------------------------------------------------------------

    def on_reactor_init(self, event: Any) -> None:
        event.container.schedule(0.1, self)

    def on_timer_task(self, event: Any) -> None:
        with self.server._lock:
            self._answer_delayed()
            self._expire_locks()
            self._time_out_session_waits()
        event.container.schedule(0.1, self)

    def on_stop_server(self, event: Any) -> None:
        assert self.server._container is not None
        # Close the listening socket too (the container's stop leaves it open), so a restart
        # can listen on the same port again.
        if self.server._acceptor is not None:
            self.server._acceptor.close()
        # ...and drop every client connection, as a restarting gateway does: the SDK sees its
        # connection go and reconnects, instead of waiting on a socket nobody reads.
        for connection in list(self.connections):
            connection.close()
            if connection.transport is not None:
                connection.transport.close_tail()
                connection.transport.close_head()
        self.connections.clear()
        self.server._container.stop()

    def on_unhandled(self, name: str, event: Any) -> None:
        pass

    def on_connection_remote_open(self, event: Any) -> None:
        self.server.requests["connection"] += 1
        self.connections.add(event.connection)
        transport = event.connection.transport
        if transport is not None and transport.tracer is None:
            # Proton applies a disposition to every delivery of its range, one event each: the
            # frames themselves are counted from its frame trace.
            transport.trace(Transport.TRACE_FRM)
            transport.tracer = self._count_frame
        if event.connection.state & Endpoint.LOCAL_UNINIT:
            event.connection.container = "servicebus-fake"
            event.connection.open()

    def _count_frame(self, transport: Any, frame: str) -> None:
        """
        Count each disposition the client sends (``settle``). With ``ignore_ranges``, also note
        the delivery id of each transfer sent and the deliveries a range names after its first.
        """
        if "<- @disposition" in frame:
            self.server.requests["settle"] += 1
            if self.server.ignore_ranges and (ranged := _RANGE_DISPOSITION.search(frame)):
                first, last = int(ranged[1], 0), int(ranged[2], 0)
                self.ignored_ids[transport].update(range(first + 1, last + 1))
        elif self.server.ignore_ranges and (sent := _SENT_TRANSFER.search(frame)):
            tag = codecs.escape_decode(sent[2].encode("latin-1"))[0]
            self.delivery_ids[transport][tag] = int(sent[1], 0)

    def _ignored_in_range(self, dlv: Any) -> bool:
        """Whether ``ignore_ranges`` leaves this settlement unapplied (not the range's first)."""
        stored = self.deliveries.get(dlv)
        if stored is None or stored.lock_token is None:
            return False
        transport = dlv.link.connection.transport
        # The tag is the lock token (proton's Delivery.tag decodes it as text: not usable here).
        delivery_id = self.delivery_ids[transport].pop(stored.lock_token.bytes_le, None)
        if delivery_id is None or delivery_id not in self.ignored_ids[transport]:
            return False
        self.ignored_ids[transport].discard(delivery_id)
        return True

    def on_connection_remote_close(self, event: Any) -> None:
        event.connection.close()

    def on_session_remote_open(self, event: Any) -> None:
        if event.session.state & Endpoint.LOCAL_UNINIT:
            event.session.open()

    def on_session_remote_close(self, event: Any) -> None:
        event.session.close()

    def on_transport_closed(self, event: Any) -> None:
        connection = event.connection
        if connection is None:
            return
        with self.server._lock:
            for link in [lnk for lnk in self.entity_of if lnk.connection == connection]:
                self._forget_link(link)
            self.delivery_ids.pop(event.transport, None)
            self.ignored_ids.pop(event.transport, None)

    # -- links --------------------------------------------------------------------------------------

    def on_link_remote_open(self, event: Any) -> None:
        link = event.link
        if not link.state & Endpoint.LOCAL_UNINIT:
            return
        self.server.requests["attach"] += 1
        link.source.copy(link.remote_source)
        link.target.copy(link.remote_target)
        link.snd_settle_mode = link.remote_snd_settle_mode
        link.rcv_settle_mode = link.remote_rcv_settle_mode
        with self.server._lock:
            if link.is_receiver:
                self._open_incoming(link)
            else:
                self._open_outgoing(link)

    def _refuse(self, link: Any, condition: str, description: str) -> None:
        link.open()
        link.condition = Condition(condition, description)
        link.close()

    def _open_incoming(self, link: Any) -> None:
        """A link the client sends on: to an entity, or requests to ``$cbs`` / ``$management``."""
        path = entity_path(link.remote_target.address)
        is_node = path == "$cbs" or path.lower().endswith(MANAGEMENT_SUFFIX)
        if not is_node and self.server._sendable(path) is None:
            self._refuse(link, "amqp:not-found", f"The messaging entity '{path}' could not be found.")
            return
        if self.server.max_message_size and not is_node:
            link.max_message_size = self.server.max_message_size
        link.open()
        link.flow(1000)

    def _open_outgoing(self, link: Any) -> None:
        """A link the client receives on: from an entity, or responses from a node."""
        path = entity_path(link.remote_source.address)
        if path == "$cbs" or path.lower().endswith(MANAGEMENT_SUFFIX):
            link.open()
            return
        entity = self.server._receivable(path)
        if entity is None:
            self._refuse(link, "amqp:not-found", f"The messaging entity '{path}' could not be found.")
            return
        if entity.requires_session:
            wanted = _filters(link.remote_source.filter).get(SESSION_FILTER)
            timeout_ms = (link.remote_properties or {}).get(symbol("com.microsoft:timeout"), 60000)
            self.pending_sessions.append((link, entity, time.monotonic() + timeout_ms / 1000, wanted))
            self._assign_sessions(entity)
            return
        link.open()
        self.entity_of[link] = entity
        entity.receivers.append(link)

    def _assign_sessions(self, entity: Entity) -> None:
        for pending in list(self.pending_sessions):
            link, pending_entity, _, wanted = pending
            if pending_entity is not entity:
                continue
            if wanted is not None:
                if wanted in entity.session_owner:
                    self.pending_sessions.remove(pending)
                    self._refuse(
                        link,
                        "com.microsoft:session-cannot-be-locked",
                        f"The session '{wanted}' is locked by another receiver.",
                    )
                    continue
                session_id = wanted
            else:
                candidates = [
                    m.session_id
                    for m in entity.available
                    if m.session_id is not None and m.session_id not in entity.session_owner
                ]
                if not candidates:
                    continue
                session_id = candidates[0]
            self.pending_sessions.remove(pending)
            entity.session_owner[session_id] = link
            link.source.filter.clear()
            link.source.filter.put_dict({SESSION_FILTER: session_id})
            expiry_ms = _now_ms() + int(entity.lock_duration * 1000)
            entity.session_locked_until_ms[session_id] = expiry_ms
            link.properties = {SESSION_LOCKED_UNTIL: expiry_ms * 10_000 + DOTNET_EPOCH_TICKS}
            link.open()
            self.entity_of[link] = entity
            self.session_of[link] = session_id
            entity.receivers.append(link)
            self._pump(entity)

    def _time_out_session_waits(self) -> None:
        now = time.monotonic()
        for pending in list(self.pending_sessions):
            link, _, deadline, _ = pending
            if now >= deadline:
                self.pending_sessions.remove(pending)
                self._refuse(link, "com.microsoft:timeout", "No session available before the timeout.")

    def on_link_remote_close(self, event: Any) -> None:
        with self.server._lock:
            self._forget_link(event.link)
        event.link.close()

    def _forget_link(self, link: Any) -> None:
        self.pending_sessions = [p for p in self.pending_sessions if p[0] != link]
        entity = self.entity_of.pop(link, None)
        if entity is None:
            return
        with contextlib.suppress(ValueError):
            entity.receivers.remove(link)
        session_id = self.session_of.pop(link, None)
        if session_id is not None:
            entity.session_owner.pop(session_id, None)
            entity.session_locked_until_ms.pop(session_id, None)
            # The session lock goes with the link: its locked messages return to the session.
            for token, stored in list(entity.locked.items()):
                if stored.link == link:
                    del entity.locked[token]
                    entity.make_available(stored)
            self._assign_sessions(entity)
        # Non-session locks outlive the link, as on the service: they expire or are settled
        # through $management.
        for dlv in [d for d, s in self.deliveries.items() if d.link == link]:
            self.deliveries.pop(dlv, None)

    def on_link_flow(self, event: Any) -> None:
        link = event.link
        with self.server._lock:
            entity = self.entity_of.get(link)
            if entity is not None:
                if link.is_sender:
                    self.server.requests["receive"] += 1
                for stored in entity.available:
                    if stored.released_by == link:
                        stored.released_by = None
                self._pump(entity)
            if link.is_sender and link.drain_mode and link.credit > 0:
                link.drained()

    # -- delivering ----------------------------------------------------------------------------------

    def _pump(self, entity: Entity) -> None:
        for link in list(entity.receivers):
            session_id = self.session_of.get(link)
            while link.credit > 0:
                stored = self._next_for(entity, link, session_id)
                if stored is None:
                    break
                self._deliver(entity, link, stored)
            if link.drain_mode and link.credit > 0:
                link.drained()

    @staticmethod
    def _next_for(entity: Entity, link: Any, session_id: str | None) -> StoredMessage | None:
        for i, stored in enumerate(entity.available):
            if entity.requires_session and stored.session_id != session_id:
                continue
            if stored.released_by == link:
                continue
            return entity.available.pop(i)
        return None

    def _deliver(self, entity: Entity, link: Any, stored: StoredMessage) -> None:
        presettled = link.snd_settle_mode == Link.SND_SETTLED
        if presettled:
            tag = uuid.uuid4()
            payload = encode_for_delivery(stored, lock_token=None)
        else:
            tag = uuid.uuid4()
            stored.lock_token = tag
            stored.link = link
            stored.locked_until_ms = _now_ms() + int(entity.lock_duration * 1000)
            entity.locked[tag] = stored
            self.server.locked_deliveries += 1
            payload = encode_for_delivery(stored, lock_token=tag)
        dlv = link.delivery(tag.bytes_le)
        link.send(payload)
        link.advance()
        if presettled:
            dlv.settle()
        else:
            self.deliveries[dlv] = stored

    def _expire_locks(self) -> None:
        now = _now_ms()
        for entity in self._all_entities():
            for session_id, until in list(entity.session_locked_until_ms.items()):
                if until <= now:
                    self._expire_session_lock(entity, session_id)
            expired = [s for s in entity.locked.values() if s.locked_until_ms <= now]
            for stored in expired:
                if self.session_of.get(stored.link) is not None:
                    continue  # session messages are locked by the session lock
                del entity.locked[stored.lock_token]
                self._redeliver_later(entity, stored)
            if expired:
                self._pump(entity)

    def _expire_session_lock(self, entity: Entity, session_id: str) -> None:
        """
        Take a session from its receiver, as the service does when its lock runs out: the link
        is detached with ``session-lock-lost``, and the messages it held come back (count + 1).
        """
        self.server.expired_session_locks += 1
        link = entity.session_owner.get(session_id)
        for token, stored in list(entity.locked.items()):
            if stored.link is not None and stored.link == link:
                del entity.locked[token]
                self._redeliver_later(entity, stored)
        if link is not None:
            link.condition = Condition(
                "com.microsoft:session-lock-lost",
                f"The session lock has expired on the MessageSession {session_id!r}. Accept a new "
                "MessageSession.",
            )
            link.close()
            self._forget_link(link)
        entity.session_owner.pop(session_id, None)
        entity.session_locked_until_ms.pop(session_id, None)
        self._assign_sessions(entity)

    def _redeliver_later(self, entity: Entity, stored: StoredMessage) -> None:
        stored.delivery_count += 1
        if stored.delivery_count >= entity.max_delivery_count:
            self._dead_letter(
                entity,
                stored,
                "MaxDeliveryCountExceeded",
                f"Message could not be consumed after {entity.max_delivery_count} delivery attempts.",
            )
            return
        entity.make_available(stored)

    @staticmethod
    def _dead_letter(
        entity: Entity, stored: StoredMessage, reason: str | None, description: str | None
    ) -> None:
        extra = {}
        if reason is not None:
            extra["DeadLetterReason"] = reason
        if description is not None:
            extra["DeadLetterErrorDescription"] = description
        annotations = {**stored.annotations, symbol("x-opt-deadletter-source"): entity.path}
        assert entity.dead_letter is not None
        entity.dead_letter.enqueue(
            with_application_properties(stored.bare, extra), annotations, delivery_count=stored.delivery_count
        )

    def _all_entities(self) -> list[Entity]:
        entities = list(self.server._queues.values())
        for topic in self.server._topics.values():
            entities.extend(topic.subscriptions.values())
        return entities + [e.dead_letter for e in entities if e.dead_letter is not None]

    # -- incoming transfers and dispositions ----------------------------------------------------------

    def on_delivery(self, event: Any) -> None:
        dlv, link = event.delivery, event.link
        with self.server._lock:
            if link.is_receiver:
                if dlv.readable and not dlv.partial:
                    payload = link.recv(dlv.pending)
                    link.advance()
                    self._on_transfer(link, dlv, payload)
                    if link.credit < 500:
                        link.flow(1000 - link.credit)
            elif dlv.updated:
                self._on_disposition(dlv)

    def _on_transfer(self, link: Any, dlv: Any, payload: bytes) -> None:
        path = entity_path(link.remote_target.address)
        if path == "$cbs":
            self.server.requests["$cbs put-token"] += 1
            self._answer(link, self._put_token(payload))
        elif path.lower().endswith(MANAGEMENT_SUFFIX):
            self.server.requests["$management"] += 1
            entity = self.server._receivable(path[: -len(MANAGEMENT_SUFFIX)])
            delay = _session_renewal_delay(payload, self.server.session_renewal_delay)
            if delay > 0:
                self.delayed.append((time.monotonic() + delay, link, entity, payload))
            else:
                self._answer(link, self._management(entity, payload))
        else:
            targets = self.server._sendable(path) or []
            for encoded in split_batch(payload):
                bare, annotations = parse_sent(encoded)
                if targets and self.server.seen_within_window(path, bare):
                    continue  # accepted, and dropped: a duplicate
                for entity in targets:
                    entity.enqueue(bare, annotations)
            for entity in targets:
                self._pump(entity)
        if not dlv.settled:
            dlv.update(Delivery.ACCEPTED)
            dlv.settle()

    def _answer_delayed(self) -> None:
        now = time.monotonic()
        for pending in [p for p in self.delayed if p[0] <= now]:
            self.delayed.remove(pending)
            _, link, entity, payload = pending
            try:
                if link.state & Endpoint.REMOTE_CLOSED or link.connection.state & Endpoint.REMOTE_CLOSED:
                    continue  # the client went away: nobody to answer
                self._answer(link, self._management(entity, payload))
            except Exception as exc:  # the link was freed meanwhile
                log.debug("Dropped a delayed answer: %s", exc)

    def _answer(self, request_link: Any, response: Message) -> None:
        """Send a response on the session's link whose source is the request link's target."""
        address = request_link.remote_target.address
        for candidate in _links(request_link.session):
            if candidate.is_sender and candidate.remote_source.address == address and candidate.credit > 0:
                dlv = candidate.delivery(uuid.uuid4().bytes)
                candidate.send(response.encode())
                candidate.advance()
                dlv.settle()
                return
        log.warning("No response link with credit for %s", address)

    def _on_disposition(self, dlv: Any) -> None:
        """
        Apply a settlement from the client; echo its outcome unless the client pre-settled it.

        The echo is what ``rcv-settle-mode second`` waits for: the SDK compares it with the
        outcome it sent (abandon comes back ``modified``, dead-letter ``rejected`` without an
        error) and treats a ``rejected`` carrying an error as a failed settlement.
        """
        state = dlv.remote_state
        if not state:
            return
        if self.server.ignore_ranges and self._ignored_in_range(dlv):
            return  # still locked, no outcome: it runs out, or is settled again some other way
        self.server.settled_deliveries += 1
        stored = self.deliveries.pop(dlv, None)
        entity = self.entity_of.get(dlv.link)
        if stored is None or entity is None or stored.lock_token not in entity.locked:
            if dlv.settled:  # a pre-settled release of something already gone: nothing to answer
                dlv.settle()
                return
            self.server.lock_lost_settlements += 1
            dlv.local.condition = Condition(
                "com.microsoft:message-lock-lost",
                "The lock supplied is invalid. Either the lock expired, or the message has already "
                "been removed from the queue.",
            )
            dlv.update(Delivery.REJECTED)
            dlv.settle()
            return
        if state == Delivery.REJECTED and entity.path.lower() in self.server.dead_letter_refused:
            self.deliveries[dlv] = stored  # still locked: its lock runs out and it comes back
            dlv.local.condition = Condition(
                "amqp:internal-error", "Dead-lettering is switched off by the test."
            )
            dlv.update(Delivery.REJECTED)
            dlv.settle()
            return
        del entity.locked[stored.lock_token]
        if state == Delivery.ACCEPTED:
            self.server.completed_deliveries += 1
            dlv.update(Delivery.ACCEPTED)
        elif state == Delivery.REJECTED:
            condition = dlv.remote.condition
            info = dict(condition.info or {}) if condition is not None else {}
            self._dead_letter(
                entity,
                stored,
                _text(info.get("DeadLetterReason", info.get(symbol("DeadLetterReason")))),
                _text(info.get("DeadLetterErrorDescription", info.get(symbol("DeadLetterErrorDescription")))),
            )
            dlv.update(Delivery.REJECTED)
        elif state == Delivery.MODIFIED:
            dlv.local.failed = dlv.remote.failed
            dlv.local.undeliverable = dlv.remote.undeliverable
            self._redeliver_later(entity, stored)
            dlv.update(Delivery.MODIFIED)
        else:  # RELEASED: not processed, so the delivery count stays
            self.server.released_deliveries += 1
            link = stored.link
            entity.make_available(stored)
            stored.released_by = link
            dlv.update(Delivery.RELEASED)
        dlv.settle()
        self._pump(entity)

    # -- $cbs ------------------------------------------------------------------------------------------

    def _put_token(self, payload: bytes) -> Message:
        request = Message()
        request.decode(payload)
        properties = request.properties or {}
        status, description = 200, "OK"
        if self.server.sas_keys is not None and not _valid_sas(_text(request.body), self.server.sas_keys):
            self.server.refused_tokens += 1
            status, description = 401, "InvalidSignature: The token has an invalid signature."
        elif properties.get("operation") != "put-token":
            status, description = 400, "Unsupported $cbs operation"
        response = Message(correlation_id=request.id)
        response.properties = {"status-code": status, "status-description": description}
        return response

    # -- $management -------------------------------------------------------------------------------------

    def _management(self, entity: Entity | None, payload: bytes) -> Message:
        request = Message()
        request.decode(payload)
        operation = (request.properties or {}).get("operation")
        body = request.body if isinstance(request.body, dict) else {}
        status, value, error = 200, {}, None
        if entity is None:
            status, error = 404, ("com.microsoft:entity-not-found", "The messaging entity does not exist.")
        elif operation == "com.microsoft:renew-lock":
            status, value, error = self._renew_locks(entity, _field(body, "lock-tokens"))
        elif operation == "com.microsoft:update-disposition":
            status, value, error = self._update_disposition(entity, body)
        elif operation == "com.microsoft:peek-message":
            status, value = self._peek(entity, body)
        elif operation == "com.microsoft:renew-session-lock":
            status, value, error = self._renew_session_lock(entity, _text(_field(body, "session-id")))
        else:
            status, error = 501, ("amqp:not-implemented", f"The fake does not implement {operation!r}.")
        response = Message(correlation_id=request.id, body=value)
        properties: dict[str, Any] = {"statusCode": status, "statusDescription": error[1] if error else "OK"}
        if error:
            properties["errorCondition"] = symbol(error[0])
        response.properties = properties
        return response

    def _locked(self, entity: Entity, tokens: Any) -> tuple[list[StoredMessage], bool]:
        found = [entity.locked.get(_as_uuid(t)) for t in tokens or ()]
        return [s for s in found if s is not None], all(s is not None for s in found)

    def _renew_locks(self, entity: Entity, tokens: Any) -> tuple[int, Any, Any]:
        stored, complete = self._locked(entity, tokens)
        if not complete:
            self.server.lock_lost_settlements += 1
            return 410, {}, ("com.microsoft:message-lock-lost", "The lock supplied is invalid.")
        until = _now_ms() + int(entity.lock_duration * 1000)
        for message in stored:
            message.locked_until_ms = until
        return (
            200,
            {"expirations": Array(UNDESCRIBED, Data.TIMESTAMP, *[timestamp(until)] * len(stored))},
            None,
        )

    def _renew_session_lock(self, entity: Entity, session_id: str | None) -> tuple[int, Any, Any]:
        if session_id is None or session_id not in entity.session_locked_until_ms:
            return 410, {}, ("com.microsoft:session-lock-lost", "The session lock has expired.")
        until = _now_ms() + int(entity.lock_duration * 1000)
        entity.session_locked_until_ms[session_id] = until
        self.server.session_lock_renewals[session_id] += 1
        self.server.session_lock_renewed_at[session_id].append(time.monotonic())
        return 200, {"expiration": timestamp(until)}, None

    def _update_disposition(self, entity: Entity, body: dict[str, Any]) -> tuple[int, Any, Any]:
        stored, complete = self._locked(entity, _field(body, "lock-tokens"))
        if not complete:
            self.server.lock_lost_settlements += 1
            return 410, {}, ("com.microsoft:message-lock-lost", "The lock supplied is invalid.")
        status = _field(body, "disposition-status")
        if status == "suspended" and entity.path.lower() in self.server.dead_letter_refused:
            return 500, {}, ("amqp:internal-error", "Dead-lettering is switched off by the test.")
        for message in stored:
            del entity.locked[message.lock_token]
            if status == "completed":
                self.server.completed_deliveries += 1
                continue
            if status == "suspended":
                self._dead_letter(
                    entity,
                    message,
                    _text(_field(body, "deadletter-reason")),
                    _text(_field(body, "deadletter-description")),
                )
            elif status == "abandoned":
                self._redeliver_later(entity, message)
            else:
                entity.make_available(message)
        self._pump(entity)
        return 200, {}, None

    def _peek(self, entity: Entity, body: dict[str, Any]) -> tuple[int, Any]:
        start = int(_field(body, "from-sequence-number") or 0)
        count = int(_field(body, "message-count") or 1)
        every = sorted([*entity.available, *entity.locked.values()], key=lambda m: m.sequence_number)
        chosen = [m for m in every if m.sequence_number >= start][:count]
        if not chosen:
            return 204, {}
        return 200, {"messages": [{"message": encode_for_delivery(m, lock_token=None)} for m in chosen]}


def _links(session: Any) -> Iterator[Any]:
    link = session.connection.link_head(0)
    while link is not None:
        if link.session == session:
            yield link
        link = link.next(0)


def _filters(data: Any) -> dict[Any, Any]:
    """A link source's filter map (the Data must be positioned on it: unread, it is ``None``)."""
    data.rewind()
    value = data.get_object() if data.next() is not None else None
    data.rewind()
    return dict(value or {})


def _field(body: dict[Any, Any], name: str) -> Any:
    return body.get(name, body.get(symbol(name)))


def _text(value: Any) -> str | None:
    if value is None:
        return None
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value).decode("utf-8")
    return str(value)


def _as_uuid(token: Any) -> uuid.UUID:
    return token if isinstance(token, uuid.UUID) else uuid.UUID(str(token))


def _valid_sas(token: str | None, keys: dict[str, str]) -> bool:
    """Check a ``SharedAccessSignature sr=..&sig=..&se=..&skn=..`` token against the known keys."""
    if not token or not token.startswith("SharedAccessSignature "):
        return False
    fields = dict(
        part.split("=", 1) for part in token[len("SharedAccessSignature ") :].split("&") if "=" in part
    )
    key = keys.get(fields.get("skn", ""))
    if key is None or "sr" not in fields or "se" not in fields or "sig" not in fields:
        return False
    signed = hmac.new(key.encode(), f"{fields['sr']}\n{fields['se']}".encode(), hashlib.sha256).digest()
    return hmac.compare_digest(base64.b64encode(signed).decode(), unquote(fields["sig"]))


__all__ = ["ServiceBusServer", "StoredMessage", "ulong"]


# -- the server in a child process -------------------------------------------------------------


def _servicebus_child(conn: Any, root: str) -> None:
    """The Service Bus test server in a process of its own, driven over a pipe (spawned)."""
    sys.path.insert(0, root)
    logging.getLogger("azure").setLevel(logging.WARNING)
    from tests.support.servicebus_server import ServiceBusServer

    server = ServiceBusServer().start()
    conn.send(server.port)
    while True:
        command, args, kwargs = conn.recv()
        if command == "stop":
            server.stop()
            conn.send(("ok", None))
            return
        try:
            if command == "requests":
                result: Any = dict(server.requests)
            elif command == "reset":
                result = server.requests.clear()
            elif command == "settled_deliveries":
                result = server.settled_deliveries
            elif command == "counters":
                result = server.counters()
            elif command == "message_count":  # available and locked (messages are not picklable)
                result = len(server.messages(*args))
            else:
                result = getattr(server, command)(*args, **kwargs)
            conn.send(("ok", result))
        except Exception as exc:
            conn.send(("error", f"{type(exc).__name__}: {exc}"))


class ServiceBusServerProcess:
    """
    The server in a process of its own (spawned), driven over a pipe.

    For what must not share this process's GIL with the broker: benchmarks (the server's CPU is
    not the client's) and timing behaviour of the SDK that an in-process server hides (a reply
    that lands while the client's thread is busy). ``call`` runs any method of the server there;
    :meth:`counts` and :meth:`reset` read its request counter.
    """

    def __init__(self) -> None:
        import multiprocessing

        context = multiprocessing.get_context("spawn")
        self._conn, child = context.Pipe()
        root = str(Path(__file__).resolve().parents[2])
        self.process = context.Process(target=_servicebus_child, args=(child, root), daemon=True)
        self.process.start()
        if not self._conn.poll(60):
            self.process.kill()
            raise RuntimeError("the Service Bus test server did not start within 60 s")
        self.port: int = self._conn.recv()

    def call(self, command: str, *args: Any, **kwargs: Any) -> Any:
        """Run ``ServiceBusServer.<command>(*args, **kwargs)`` in the child; return its result."""
        self._conn.send((command, args, kwargs))
        status, result = self._conn.recv()
        if status != "ok":
            raise RuntimeError(f"Service Bus test server: {command} failed: {result}")
        return result

    def connection_string(self) -> str:
        """A development-emulator connection string (the child's server accepts any token)."""
        return (
            f"Endpoint=sb://127.0.0.1:{self.port};SharedAccessKeyName=RootManageSharedAccessKey;"
            "SharedAccessKey=fake-key;UseDevelopmentEmulator=true;"
        )

    def connection(self) -> dict[str, Any]:
        """An ``azure_service_bus`` Airflow connection (JSON form) for the child's server."""
        return {"conn_type": "azure_service_bus", "schema": self.connection_string()}

    def reset(self) -> None:
        self.call("reset")

    def counts(self) -> dict[str, int]:
        return dict(self.call("requests"))

    def cpu_seconds(self) -> float:
        return 0.0

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.call("stop")
        self.process.join(10)
        if self.process.is_alive():
            self.process.kill()
            self.process.join(5)
