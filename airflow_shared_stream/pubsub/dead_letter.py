"""
The dead-letter copy of a Pub/Sub message, made to fit what Pub/Sub accepts.

The copy is the original's data, attributes and ordering key, plus five attributes of ours (why,
and where it came from). Pub/Sub refuses a message with more than 100 attributes and a publish
request over 10 MB. A copy over either limit would be refused every time: the advance fails, the
stream fails, the message comes back and is rejected again, a crash loop. So a copy is fitted:

* attributes: ours are always kept; when the original's would take the count over 100, the ones
  whose names sort last are left out, and ``dead_letter_attributes_dropped`` says how many;
* size: when the copy's publish request would exceed 10 MB, the data is cut to fit, and
  ``dead_letter_truncated_from`` carries its original length in bytes. Only a message of close to
  10 MB gets there (its original publish request fitted; ours adds about 1.5 KB); the sizes are
  the serialized request's, the way google-cloud-pubsub's publisher counts them.

Google's emulator enforces neither limit (it took 105 attributes and an 11 MB message): the unit
tests check the fitting, the emulator tests that the copy still carries what it must.
"""

from __future__ import annotations

from typing import Any

DEAD_LETTER_REASON = "dead_letter_reason"
DEAD_LETTER_DESCRIPTION = "dead_letter_description"
DEAD_LETTER_ORIGIN_SUBSCRIPTION = "dead_letter_origin_subscription"
DEAD_LETTER_ORIGIN_MESSAGE_ID = "dead_letter_origin_message_id"
DEAD_LETTER_ORIGIN_PUBLISH_TIME = "dead_letter_origin_publish_time"
DEAD_LETTER_ATTRIBUTES_DROPPED = "dead_letter_attributes_dropped"
SERVICE_STAMP_PREFIX = "CloudPubSubDeadLetterSource"
"""What Pub/Sub's dead-letter policy stamps on what it forwards: never kept on a copy of ours, where
it could only be stale or forged (a redrive trusts it as the policy's, see pubsub/redrive.py)."""
DEAD_LETTER_TRUNCATED_FROM = "dead_letter_truncated_from"

MAX_ATTRIBUTES = 100
"""Pub/Sub's limit on the attributes of one message."""
ATTRIBUTE_VALUE_LIMIT = 1024
"""Pub/Sub's limit on an attribute value, in bytes."""
PUBLISH_REQUEST_BYTES = 10 * 1000 * 1000
"""Pub/Sub's limit on one serialized ``PublishRequest`` (google-cloud-pubsub's
``_SERVER_PUBLISH_MAX_BYTES``)."""
_LENGTH_PREFIXES = 1 + 4 + 4
"""Most bytes data adds to a request besides itself: the data field's tag and length (a varint, 4
bytes up to 256 MiB), and what the message's own length prefix grows by."""


def copy_for_dead_letter(
    *,
    topic: str,
    data: bytes,
    attributes: dict[str, str],
    ordering_key: str,
    ours: dict[str, str],
) -> Any:
    """
    The raw protobuf ``PubsubMessage`` to publish to ``topic``: the original plus ``ours``, fitted.

    ``ours`` are the attributes the stream adds (at most five; their values already within
    :data:`ATTRIBUTE_VALUE_LIMIT`). See the module docstring for what gives way when it must.
    """
    originals = {
        name: value
        for name, value in attributes.items()
        if name not in ours and not name.startswith(SERVICE_STAMP_PREFIX)
    }
    markers: dict[str, str] = {}
    if request_size(topic, _message(data, {**originals, **ours}, ordering_key)) > PUBLISH_REQUEST_BYTES:
        markers[DEAD_LETTER_TRUNCATED_FROM] = str(len(data))
    room = MAX_ATTRIBUTES - len(ours) - len(markers)
    if len(originals) > room:
        room -= 1  # for the marker that says how many were left out
        kept = sorted(originals)[:room]
        markers[DEAD_LETTER_ATTRIBUTES_DROPPED] = str(len(originals) - len(kept))
        originals = {name: originals[name] for name in kept}
    copy_attributes = {**originals, **ours, **markers}
    if DEAD_LETTER_TRUNCATED_FROM not in markers:
        return _message(data, copy_attributes, ordering_key)
    without_data = request_size(topic, _message(b"", copy_attributes, ordering_key))
    # The data field's tag and length prefix, and the longer length prefix of the message itself.
    room = max(0, PUBLISH_REQUEST_BYTES - without_data - _LENGTH_PREFIXES)
    fitted = _message(data[:room], copy_attributes, ordering_key)
    slack = PUBLISH_REQUEST_BYTES - request_size(topic, fitted)
    if slack > 0:  # the prefixes took less than allowed for: take the rest of the room
        fitted = _message(data[: room + slack], copy_attributes, ordering_key)
    return fitted


def request_size(topic: str, *messages: Any) -> int:
    """Bytes of the serialized ``PublishRequest`` carrying ``messages`` to ``topic``."""
    from google.pubsub_v1 import types

    request = types.PublishRequest.pb()(topic=topic)
    request.messages.extend(messages)
    return int(request.ByteSize())


def _message(data: bytes, attributes: dict[str, str], ordering_key: str) -> Any:
    from google.pubsub_v1 import types

    return types.PubsubMessage.pb()(data=data, attributes=attributes, ordering_key=ordering_key)


def truncate_utf8(text: str, limit: int) -> str:
    """``text`` in at most ``limit`` UTF-8 bytes, cut on a character boundary and marked ``...``."""
    encoded = text.encode("utf-8")
    if len(encoded) <= limit:
        return text
    return encoded[: limit - 3].decode("utf-8", errors="ignore") + "..."
