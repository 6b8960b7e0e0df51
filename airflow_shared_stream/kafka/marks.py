"""
What a watcher's committed position says besides the offset: the consumer shape that wrote it, and when.

A watcher's identity (:func:`~airflow_shared_stream.kafka.watchers.watcher_digest`) leaves its tuning
out, so a redeploy with other tuning keeps its position. Two watchers that differ only in a shaping
argument (``dead_letter_topic``, ``max_in_flight``, ``max_payload_bytes``) therefore share one
position. On one triggerer the second one fails (``common/trigger.py``); on two triggerers each
runs its own consumer, both commit under that one position, and one commits past records the
other never persisted. So every commit of a position carries a **mark** in the offset's metadata
(Kafka's own field for it): the shape of the consumer that wrote it, when, and whether that
watcher is still running there. A watcher that finds its position marked by a *live* writer of
another shape fails, naming the arguments; the producer looks when it admits the watcher and
each time it commits the position again to keep it from expiring.

A writer counts as live for ``LIVE_FOR`` seconds after its last mark, unless its last mark says
it left (a watcher that stops cleanly marks its position so on the way out). A triggerer that
died leaves a live mark behind: a watcher redeployed with other tuning fails until that mark is
``LIVE_FOR`` old, then takes the position over. Brokers that drop commit metadata (Tansu 0.6.0)
return no mark, and the check cannot see the other triggerer there.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

MARK_FORMAT = 1
"""Version of the mark's JSON; a mark of another version (or foreign metadata) is ignored."""

LIVE_FOR = 300.0
"""Seconds a mark stands for a running writer: several rounds of the producer's position refresh,
so a writer that is late by a round or whose clock is a little off still counts as live."""


@dataclass(frozen=True)
class PositionMark:
    """The shape of the consumer that committed a position, when (Unix time), and if it still runs."""

    shape: dict[str, Any]
    written_at: float
    live: bool = True

    def encode(self) -> str:
        fields = {"v": MARK_FORMAT, "shape": self.shape, "at": round(self.written_at, 3), "live": self.live}
        return json.dumps(fields, sort_keys=True, separators=(",", ":"))

    @classmethod
    def decode(cls, metadata: str) -> PositionMark | None:
        """The mark in a commit's metadata, or ``None`` (none, another format, someone else's text)."""
        if not metadata:
            return None
        try:
            fields = json.loads(metadata)
        except ValueError:
            return None
        if not isinstance(fields, dict) or fields.get("v") != MARK_FORMAT:
            return None
        shape, written_at, live = fields.get("shape"), fields.get("at"), fields.get("live")
        if (
            not isinstance(shape, dict)
            or not isinstance(written_at, int | float)
            or not isinstance(live, bool)
        ):
            return None
        return cls(shape, float(written_at), live)


def newest_mark(metadata: Iterable[str]) -> PositionMark | None:
    """The most recent mark among a position's partitions (one commit marks them all alike)."""
    marks = [mark for mark in map(PositionMark.decode, metadata) if mark is not None]
    return max(marks, key=lambda mark: mark.written_at, default=None)


def disagreements(shape: Mapping[str, Any], mark: PositionMark | None, now: float) -> list[str]:
    """
    The arguments on which a live writer of the position disagrees with ``shape`` (``[]``: none).

    Spelled ``name=<theirs> (here <ours>)``, for the error that names them.
    """
    if mark is None or not mark.live or now - mark.written_at > LIVE_FOR:
        return []
    theirs = mark.shape
    return [
        f"{name}={theirs.get(name)!r} (here {shape.get(name)!r})"
        for name in sorted(set(shape) | set(theirs))
        if theirs.get(name) != shape.get(name)
    ]
