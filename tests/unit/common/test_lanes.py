"""LaneTracker: an ordered lane's bookkeeping on its own (pure logic)."""

from __future__ import annotations

from typing import Any

from airflow_shared_stream.common.delivery import Delivery, InFlight
from airflow_shared_stream.common.lanes import LaneTracker
from airflow_shared_stream.common.matching import RawMessage
from airflow_shared_stream.common.settlement import Settlement


def handed_out(lanes: LaneTracker, sequence: int, lane: str | None = "A") -> InFlight[Any]:
    name = f"m{sequence}"
    delivery: Delivery[str] = Delivery(RawMessage(envelope={}, label=name), name, name, lane)
    return lanes.track(delivery, sequence)


def test_a_redelivery_holds_back_the_later_messages_of_its_lane_in_flight_only():
    lanes = LaneTracker()
    a1, a2, a3, b1 = (
        handed_out(lanes, 1),
        handed_out(lanes, 2),
        handed_out(lanes, 3),
        handed_out(lanes, 4, "B"),
    )
    assert a1.advance_lane == a2.advance_lane != b1.advance_lane
    assert lanes.settle(a2, Settlement.REDELIVER, unseen=False, holding=True) == (Settlement.REDELIVER, False)
    assert lanes.holding_back
    # a3 was acked by every watcher, but comes after a2: it is redelivered too; a1 and b1 are not.
    assert lanes.settle(a3, Settlement.ACK, unseen=False, holding=True) == (Settlement.REDELIVER, False)
    assert lanes.settle(a1, Settlement.ACK, unseen=False, holding=True) == (Settlement.ACK, False)
    assert lanes.settle(b1, Settlement.ACK, unseen=False, holding=True) == (Settlement.ACK, False)


def test_a_receive_stamped_before_its_lanes_redelivery_is_held_back_until_the_stamps_are_forgotten():
    lanes = LaneTracker()
    stamp = lanes.stamp  # a receive returned
    a1 = handed_out(lanes, 1)
    lanes.settle(a1, Settlement.REDELIVER, unseen=False, holding=True)
    assert lanes.redelivered_since("A", stamp)
    assert not lanes.redelivered_since("A", lanes.stamp), "a receive returned after it is not held back"
    assert not lanes.redelivered_since("B", stamp)
    assert lanes.stamped
    lanes.forget_stamps()
    assert not lanes.stamped
    assert not lanes.redelivered_since("A", stamp)


def test_a_lane_whose_head_reached_nobody_is_held_and_leaves_the_hold_in_its_order():
    lanes = LaneTracker()
    a1, a2 = handed_out(lanes, 1), handed_out(lanes, 2)
    assert lanes.settle(a1, Settlement.REDELIVER, unseen=True, holding=True) == (Settlement.REDELIVER, True)
    assert lanes.head_held("A")
    # a2 reached a watcher, but waits behind a1: held with it, not redelivered.
    assert lanes.settle(a2, Settlement.ACK, unseen=False, holding=True) == (Settlement.REDELIVER, True)
    lanes.finished("A", 1)
    assert not lanes.idle("A")
    lanes.finished("A", 2)
    assert lanes.idle("A")
    assert lanes.idle(None)
    offer: list[Delivery[Any]] = []
    expired = [a2.delivery, a1.delivery]  # held past the bound: the lane goes back whole, in order
    lanes.in_order(offer, expired)
    assert expired == [a1.delivery, a2.delivery]
    assert not lanes.head_held("A")


def test_messages_offered_again_leave_the_hold_in_their_lanes_order():
    lanes = LaneTracker()
    a1, a2 = handed_out(lanes, 1), handed_out(lanes, 2)
    lanes.settle(a1, Settlement.REDELIVER, unseen=True, holding=True)
    lanes.settle(a2, Settlement.ACK, unseen=False, holding=True)
    offer = [a2.delivery, a1.delivery]
    lanes.in_order(offer, [])
    assert offer == [a1.delivery, a2.delivery]
    assert lanes.head_held("A"), "offered again, the head counts as held until nothing is held any more"


def test_on_a_lane_the_broker_does_not_lock_a_stale_later_message_waits_for_the_redelivered_head():
    """
    Pub/Sub does not lock an ordering key: a pull that started before the key's redelivery can
    bring a later message the service handed out before it (FIDELITY.md, "Pub/Sub ordering key
    after a nack"). It is held back until the redelivered head comes; a pull started after the
    redelivery brings the head first, or the head is gone (dead-lettered): no wait then.
    """
    lanes = LaneTracker()

    def message(message_id: str) -> Delivery[str]:
        return Delivery(RawMessage(envelope={}, label=message_id), message_id, message_id, "K", 0, message_id)

    head, later = message("m0"), message("m1")
    before = lanes.stamp
    lanes.await_head([head, later])
    assert lanes.ahead_of_redelivery(later, before)
    assert not lanes.ahead_of_redelivery(head, before)  # the head came back: the lane is clear
    assert not lanes.ahead_of_redelivery(later, before)
    lanes.await_head([head])
    assert not lanes.ahead_of_redelivery(later, lanes.stamp)  # a pull started after: fresh
    assert not lanes.ahead_of_redelivery(later, before)
