"""
Declarative, serializable message matching: JMESPath over a decoded envelope.

A watcher's ``match`` and ``reject`` are JMESPath expressions (strings, so they survive
``serialize()``) evaluated against the envelope a producer builds from each message: the decoded
body plus the broker's metadata. ``reject`` is evaluated first: a truthy result dead-letters the
message; otherwise a truthy ``match`` fires a trigger event and anything else is skipped.
"""

from __future__ import annotations

import base64
import enum
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import jmespath
from jmespath.exceptions import JMESPathError

from airflow_shared_stream.common.errors import SharedStreamConfigurationError


class Verdict(enum.Enum):
    MATCH = "match"
    SKIP = "skip"
    REJECT = "reject"


@dataclass(slots=True)
class RawMessage:
    """
    What a producer broadcasts to its subscribers for one broker message.

    Read-only by convention, not frozen: one is built per message on every stream's hot path, and
    a frozen dataclass's ``__init__`` sets each field through ``object.__setattr__``, which costs
    more than the rest of the object.

    ``envelope`` is the JSON-able mapping matched against and used, unchanged, as the trigger
    event payload. ``unprocessable`` names why the message cannot become a trigger event at all
    (a body that does not decode, one over the payload limit); every subscriber rejects such a
    message, so it reaches the dead-letter path instead of blocking or crashing the stream.
    """

    envelope: dict[str, Any]
    label: str
    """Short, secret-free identification of the message for logs (``topic/partition@offset``)."""
    unprocessable: str | None = field(default=None)
    rejections: list[str] = field(default_factory=list, compare=False)
    """Why watchers rejected this message, one line per rejecting watcher.

    Watchers append here when they reject (the manager broadcasts this one object to all of
    them) and the producer reads it when it dead-letters the message, so the reason reaches
    the broker: Service Bus writes it on the message, SQS and Pub/Sub as an attribute.
    """

    seq: int = field(default=-1, compare=False)
    """The producer's sequence number of this yield, where it keeps one (Kafka: which records
    each watcher finished, :mod:`airflow_shared_stream.kafka.watchers`)."""

    def dead_letter_reason(self) -> str:
        """One line saying why this message is dead-lettered (unprocessable cause first)."""
        if self.unprocessable is not None:
            return f"unprocessable: {self.unprocessable}"
        if self.rejections:
            return "; ".join(self.rejections)
        return "rejected by a watcher"


def oversize_reason(size: int, limit: int) -> str:
    """The one wording of "too large to become a trigger event", for every broker."""
    return f"body of {size} bytes exceeds the {limit}-byte payload limit (max_payload_bytes)"


def build_message(
    body: bytes | str | None,
    *,
    metadata: Mapping[str, Any],
    label: str,
    max_payload_bytes: int,
    binary: str = "base64",
    body_field: str = "body",
) -> RawMessage:
    """
    Build the message every watcher of a stream sees: ``{"body": ..., **metadata}``.

    The one envelope builder of all brokers. ``body`` is decoded with :func:`decode_body`
    (JSON to an object, other UTF-8 as text). Bytes that are not UTF-8 are base64-encoded
    (``"body_encoding": "base64"`` is added) when ``binary="base64"``, or make the message
    unprocessable when ``binary="reject"``. A body larger than ``max_payload_bytes`` is never
    decoded: its envelope carries ``"body": None`` and the message is unprocessable, so every
    watcher rejects it and it goes to the dead-letter path instead of into the metadata
    database. ``metadata`` must be JSON-able and carry no secret (it becomes the event payload).
    ``body_field`` names the body in the envelope where the broker's own word differs (Kafka's
    records have a ``value``), so users' ``match`` expressions read as the broker's docs do.
    """
    envelope: dict[str, Any] = {body_field: None}
    unprocessable: str | None = None
    size = body_size(body)
    if size > max_payload_bytes:
        unprocessable = oversize_reason(size, max_payload_bytes)
    else:
        decoded, error = decode_body(body)
        if error is not None and binary == "base64" and body is not None and not isinstance(body, str):
            envelope[body_field] = base64.b64encode(bytes(body)).decode("ascii")
            envelope[f"{body_field}_encoding"] = "base64"
        elif error is not None:
            unprocessable = error
        else:
            envelope[body_field] = decoded
    if envelope.keys().isdisjoint(metadata):  # as always: no broker names its metadata "body"
        envelope.update(metadata)
    else:
        for name, value in metadata.items():
            envelope.setdefault(name, value)  # the body wins
    return RawMessage(envelope=envelope, label=label, unprocessable=unprocessable)


def body_size(body: bytes | str | None) -> int:
    """Size of a body in bytes, as the broker counts it (UTF-8 for text)."""
    if body is None:
        return 0
    if isinstance(body, str):
        return len(body.encode("utf-8"))
    return len(body)


def decode_body(data: bytes | str | None) -> tuple[Any, str | None]:
    """
    Decode a message body: JSON to an object, other text as text.

    Returns ``(body, None)``, or ``(None, reason)`` for bytes that are not UTF-8 text.
    """
    if data is None:
        return None, None
    if isinstance(data, bytes | bytearray | memoryview):
        try:
            text = bytes(data).decode("utf-8")
        except UnicodeDecodeError as exc:
            return None, f"body is not UTF-8 text ({exc.reason} at byte {exc.start})"
    else:
        text = data
    stripped = text.lstrip()
    if stripped[:1] in ("{", "[", '"') or stripped in ("true", "false", "null") or _looks_numeric(stripped):
        try:
            return json.loads(text), None
        except ValueError:
            pass
    return text, None


def _looks_numeric(text: str) -> bool:
    return bool(text) and (text[0].isdigit() or (text[0] == "-" and text[1:2].isdigit()))


def _compile(name: str, expression: str | None) -> jmespath.parser.ParsedResult | None:
    if expression is None:
        return None
    if not isinstance(expression, str) or not expression.strip():
        raise SharedStreamConfigurationError(
            f"{name} must be a non-empty JMESPath expression string, got {expression!r}"
        )
    try:
        return jmespath.compile(expression)
    except JMESPathError as exc:
        raise SharedStreamConfigurationError(
            f"{name} is not a valid JMESPath expression: {expression!r}: {exc}"
        ) from None


def is_truthy(value: Any) -> bool:
    """JMESPath truthiness: false, null and empty strings, lists and objects are false; 0 is true."""
    if value is None or value is False:
        return False
    if isinstance(value, str | list | dict):
        return len(value) > 0
    return True


class EnvelopeMatcher:
    """
    The compiled ``match``/``reject`` pair of one trigger.

    Construction raises :class:`~.errors.SharedStreamConfigurationError` for a bad expression,
    so a typo fails the Dag file's parse. Evaluation never raises: an expression that fails on a
    particular message (a function given the wrong type, say) rejects that message with the reason.
    """

    def __init__(self, match: str | None = None, reject: str | None = None) -> None:
        self._match = _compile("match", match)
        self._reject = _compile("reject", reject)

    def evaluate(self, envelope: dict[str, Any]) -> tuple[Verdict, str | None]:
        """Return the verdict for one envelope and, for a reject, why."""
        try:
            if self._reject is not None and is_truthy(self._reject.search(envelope)):
                return Verdict.REJECT, f"reject expression {self._reject.expression!r} matched"
            if self._match is None or is_truthy(self._match.search(envelope)):
                return Verdict.MATCH, None
        except Exception as exc:  # jmespath raises TypeError too, e.g. for 'a' > `1`
            return Verdict.REJECT, f"expression failed on this message: {type(exc).__name__}: {exc}"
        return Verdict.SKIP, None
