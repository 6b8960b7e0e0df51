"""
Ordered lanes of a leased queue (SQS FIFO group, Pub/Sub ordering key, Service Bus session).

When a message of a lane is redelivered, every later message of that lane still in flight is
redelivered too, whatever its own outcome, so the broker hands the lane back in its order. A
message received before its lane's redelivery but not yet handed out is held back the same way.
When the redelivered message reached nobody and is held instead (:mod:`.unseen`), the later
messages of its lane are held with it and offered again in their order.
"""

from __future__ import annotations

from collections.abc import Hashable

from airflow_shared_stream.common.delivery import Delivery, Handle, InFlight
from airflow_shared_stream.common.settlement import Settlement


class LaneTracker:
    """
    What the template knows of its ordered lanes: which messages are in flight on each, which
    are held back behind a redelivery, when each lane was last redelivered, and the order of the
    held messages. Messages are numbered by the producer (one sequence for the whole stream).
    """

    def __init__(self) -> None:
        self._in_flight: dict[Hashable, set[int]] = {}
        # Sequences to redeliver whatever their own outcome: later in a lane than a redelivery.
        self._held_back: set[int] = set()
        # Lane redeliveries so far, and the count at each lane's last one: a received batch is
        # stamped with the count when its receive returned.
        self.stamp = 0
        self._redelivered: dict[Hashable, int] = {}
        # Lanes whose latest redelivered head reached nobody and is held, and each held
        # message's place in its lane.
        self._held_heads: set[Hashable] = set()
        self._held_order: dict[Hashable, int] = {}
        # Lanes given back to a broker that does not lock a lane: the message id of the first one
        # given back, and the stamp once the broker took it.
        self._awaiting: dict[Hashable, tuple[str, int]] = {}

    @property
    def holding_back(self) -> bool:
        """Some message in flight is to be redelivered behind an earlier one of its lane."""
        return bool(self._held_back)

    def track(self, delivery: Delivery[Handle], sequence: int) -> InFlight[Handle]:
        """The payload of a message of an ordered lane handed out now, tracked on its lane."""
        lane = delivery.lane
        self._in_flight.setdefault(lane, set()).add(sequence)
        return InFlight(delivery, sequence, ("lane", lane))

    def idle(self, lane: Hashable | None) -> bool:
        """No message of ``lane`` is in flight (an unordered message has no lane to wait for)."""
        return lane is None or lane not in self._in_flight

    def redelivered_since(self, lane: Hashable, stamp: int) -> bool:
        """``lane`` was redelivered after a receive stamped ``stamp`` returned."""
        return self._redelivered.get(lane, -1) > stamp

    @property
    def stamped(self) -> bool:
        """Some lane was redelivered since the batches received so far were all handed out."""
        return bool(self._redelivered)

    def forget_stamps(self) -> None:
        """Every batch received so far is handed out: later ones are stamped after these."""
        self._redelivered.clear()

    def await_head(self, deliveries: list[Delivery[Handle]]) -> None:
        """
        These messages went back to a broker that does not lock a lane (Pub/Sub), which hands the
        first of each lane out again first. A receive that started before (it may bring a later
        message of the lane handed out before the redelivery) holds the lane's messages back
        until that first one comes: :meth:`ahead_of_redelivery`.
        """
        self.stamp += 1
        for delivery in deliveries:
            if delivery.lane is not None:
                self._awaiting.setdefault(delivery.lane, (delivery.message_id, self.stamp))

    def ahead_of_redelivery(self, delivery: Delivery[Handle], started: int) -> bool:
        """
        ``delivery``, from a receive that started at stamp ``started``, was handed out before its
        lane's redelivery (see :meth:`await_head`). A receive started after it, or the awaited
        message itself, ends the wait (the broker redelivers that one first, or not at all).
        """
        awaited = self._awaiting.get(delivery.lane)
        if awaited is None:
            return False
        message_id, stamp = awaited
        if delivery.message_id == message_id or started >= stamp:
            del self._awaiting[delivery.lane]
            return False
        return True

    def head_held(self, lane: Hashable | None) -> bool:
        """The lane's latest redelivered head reached nobody and is held."""
        return lane in self._held_heads

    def hold_in_place(self, delivery: Delivery[Handle], sequence: int) -> None:
        """Remember a held message's place in its lane, to offer the lane again in order."""
        self._held_order[delivery.lease] = sequence

    def settle(
        self, payload: InFlight[Handle], settlement: Settlement, unseen: bool, holding: bool
    ) -> tuple[Settlement, bool]:
        """
        The settlement of a message of an ordered lane, and whether it is held unseen.

        ``settlement`` is its own; ``unseen``: it reached nobody and would be held (``holding``:
        the caller holds such messages at all). A message held back behind an earlier one of its
        lane is redelivered, or held if that one was held; a redelivered message holds back the
        lane's later messages in flight and stamps the lane.
        """
        delivery, sequence = payload.delivery, payload.sequence
        lane = delivery.lane
        if sequence in self._held_back:
            self._held_back.discard(sequence)
            settlement = Settlement.REDELIVER
            unseen = holding and lane in self._held_heads
        elif settlement is Settlement.REDELIVER:
            # A new head of its lane: the lane's later messages follow what it got.
            if unseen:
                self._held_heads.add(lane)
            else:
                self._held_heads.discard(lane)
        if settlement is Settlement.REDELIVER:
            self._held_back.update(s for s in self._in_flight.get(lane, ()) if s > sequence)
            self.stamp += 1
            self._redelivered[lane] = self.stamp
        if unseen:
            self._held_order[delivery.lease] = sequence
        return settlement, unseen

    def finished(self, lane: Hashable, sequence: int) -> None:
        """A message of ``lane`` left flight (advanced, settled or held)."""
        in_flight = self._in_flight.get(lane)
        if in_flight is not None:
            in_flight.discard(sequence)
            if not in_flight:
                del self._in_flight[lane]

    def nothing_held(self) -> None:
        """No message is held unseen: no lane has a held head any more."""
        if self._held_heads:
            self._held_heads.clear()

    def in_order(self, offer: list[Delivery[Handle]], expired: list[Delivery[Handle]]) -> None:
        """Sort held messages leaving the hold (offered again or given back) into lane order."""
        order = self._held_order
        if not order:
            return
        offer.sort(key=lambda d: order.get(d.lease, -1))
        expired.sort(key=lambda d: order.get(d.lease, -1))
        for delivery in (*offer, *expired):
            order.pop(delivery.lease, None)
        self._held_heads.difference_update(d.lane for d in expired)
