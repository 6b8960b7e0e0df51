"""
Per-partition commit bookkeeping: what to commit and where to seek after one advance.

Kafka only knows a committed offset per partition: committing ``N`` says "every offset below
``N`` is done". A shared stream, though, settles messages one by one, and a message a subscriber
never got to handle (``REDELIVER``) must be read again while later ones may already be done.
:class:`OffsetLedger` reconciles the two with a **floor** per partition: the lowest offset held
for redelivery. Nothing is committed at or past the floor; the consumer seeks back to it, and the
floor lifts only once the held offset itself has been read again and settled.

Why the floor lifts on the held offset and not on a batch starting at or below it (the rule of
Airflow's own Kafka producer): after a seek back, the manager's lane still holds the messages
read *before* the seek, and they precede the re-read ones in fan-out order. A batch can then
start above the floor and still contain the re-read floor offset (``[F+3, F+4, F, F+1]``); a
rule keyed on the batch's first offset never lifts and commits stall until the consumer restarts.

Safety argument, in short: reads after a seek to ``F`` run contiguously from ``F``, and every
message read before the seek precedes them in fan-out order, so it is settled (or has lowered
the floor) before any re-read one is. When the re-read ``F`` is settled, every other held offset
the floor stood for lies above ``F`` in that same contiguous re-read and will be settled (or held
again) before anything past it is committed. Commits use the batch's *last* settled offset, never
the highest seen, because offsets are not monotonic across a seek.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import NamedTuple

from airflow_shared_stream.common.settlement import Settlement


class LaneAction(NamedTuple):
    """What the broker must do for one lane after an advance (one per advance: kept cheap)."""

    commit: int | None
    """Offset to commit (the next offset to read), or ``None`` for no commit."""
    seek: int | None
    """Offset to seek the consumer back to, or ``None``."""


class OffsetLedger:
    """The floor and last commit of every lane (one lane is one ``(topic, partition)``)."""

    def __init__(self) -> None:
        self._floors: dict[Hashable, int] = {}
        self._committed: dict[Hashable, int] = {}

    def floor(self, lane: Hashable) -> int | None:
        return self._floors.get(lane)

    def committed(self, lane: Hashable) -> int | None:
        return self._committed.get(lane)

    def forget(self, lane: Hashable) -> None:
        """Start ``lane`` over: its log is a new one (a topic created again), read from its start."""
        self._floors.pop(lane, None)
        self._committed.pop(lane, None)

    def skip_to(self, lane: Hashable, start: int) -> None:
        """
        ``lane``'s log now starts at ``start`` (retention deleted what was below): a floor held
        below it can never be read again, and the lane's commit is at least ``start``.
        """
        floor = self._floors.get(lane)
        if floor is not None and floor < start:
            del self._floors[lane]
        previous = self._committed.get(lane)
        if previous is None or previous < start:
            self._committed[lane] = start

    def settle(self, lane: Hashable, items: Sequence[tuple[int, Settlement]]) -> LaneAction:
        """
        Fold one advance batch, ``(offset, settlement)`` in fan-out order, into the lane.

        ``ACK`` and ``DEAD_LETTER`` are terminal (a dead letter is produced to its topic before
        the commit is made); ``REDELIVER`` holds its offset.
        """
        floor = self._floors.get(lane)
        last_settled: int | None = None
        held = False
        for offset, settlement in items:
            if settlement is Settlement.REDELIVER:
                floor = offset if floor is None else min(floor, offset)
                held = True
                continue
            if floor is not None and offset == floor:
                floor = None  # the held message has been read again and settled
            last_settled = offset
        if floor is None:
            self._floors.pop(lane, None)
        else:
            self._floors[lane] = floor
        commit = self._commit_past(lane, last_settled, floor)
        seek = floor if held and floor is not None else None
        return LaneAction(commit=commit, seek=seek)

    def settle_acks(self, lane: Hashable, offsets: Sequence[int]) -> int | None:
        """
        :meth:`settle` for a batch of ACKs only, ``offsets`` in fan-out order: the offset to commit.

        The common batch (every watcher took every message), folded without a settlement per
        offset; an ACK never holds or seeks, so only the commit is left to decide.
        """
        if not offsets:
            return None
        floor = self._floors.get(lane)
        if floor is not None and floor in offsets:
            floor = None  # the held message has been read again and settled
            del self._floors[lane]
        return self._commit_past(lane, offsets[-1], floor)

    def _commit_past(self, lane: Hashable, last_settled: int | None, floor: int | None) -> int | None:
        """The commit past ``last_settled`` (never at or past ``floor``), if it moves the lane's commit."""
        if last_settled is None:
            return None
        target = last_settled + 1 if floor is None else min(last_settled + 1, floor)
        previous = self._committed.get(lane)
        # A lower commit is never wrong but only causes redeliveries: skip it.
        if previous is not None and target <= previous:
            return None
        self._committed[lane] = target
        return target
