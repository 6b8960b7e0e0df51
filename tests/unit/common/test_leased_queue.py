"""The leased-queue template's own logic, against a broker recorded in memory (pure logic)."""

from __future__ import annotations

import asyncio
from collections.abc import Collection, Sequence
from typing import Any

import pytest
from airflow.triggers.shared_stream import AdvanceItem, AdvanceOutcome

from airflow_shared_stream.common.backoff import NoSubscriberBackoff
from airflow_shared_stream.common.delivery import ACK_QUEUED, DeadLetter, Delivery, chunked
from airflow_shared_stream.common.leased_queue import LeasedQueueProducer
from airflow_shared_stream.common.matching import build_message

ACKED = AdvanceOutcome(acked=1, failed=0, rejected=0)
FAILED = AdvanceOutcome(acked=0, failed=1, rejected=0)
REJECTED = AdvanceOutcome(acked=0, failed=0, rejected=1)
NOBODY = AdvanceOutcome(acked=0, failed=0, rejected=0)


class RecordedBroker(LeasedQueueProducer[str]):
    broker = "memory"
    receive_limit = 10
    settle_batch_limit = 2
    dead_letter_batch_limit = 10
    dead_letter_batch_bytes = 100

    def __init__(self, messages: list[tuple[str, str | None, str]], *, max_in_flight: int = 100) -> None:
        super().__init__(max_in_flight=max_in_flight, stream_label="memory")
        self.waiting = list(messages)  # (id, lane, body)
        self.calls: list[tuple[str, list[str]]] = []
        self.fail_dead_letter = False

    async def connect(self) -> float:
        return 30.0

    async def receive(self, max_messages: int) -> Sequence[Delivery[str]]:
        taken, self.waiting = self.waiting[:max_messages], self.waiting[max_messages:]
        if not taken:
            await asyncio.sleep(0.01)  # a short long-poll: what is published meanwhile comes next
        return [
            Delivery(
                message=build_message(body, metadata={"id": mid}, label=mid, max_payload_bytes=1000),
                handle=mid,
                lease=mid,
                lane=lane,
                size=len(body),
                message_id=mid,
            )
            for mid, lane, body in taken
        ]

    async def ack(self, deliveries: Sequence[Delivery[str]]) -> None:
        self.calls.append(("ack", [d.handle for d in deliveries]))

    async def redeliver(self, deliveries: Sequence[Delivery[str]]) -> None:
        self.calls.append(("redeliver", [d.handle for d in deliveries]))

    async def dead_letter(self, letters: Sequence[DeadLetter[str]]) -> None:
        if self.fail_dead_letter:
            raise RuntimeError("dead-letter destination refused the copy")
        self.calls.append(("dead_letter", [f"{x.delivery.handle}:{x.reason}" for x in letters]))

    async def extend_leases(
        self, deliveries: Sequence[Delivery[str]], seconds: float
    ) -> Collection[Delivery[str]]:
        self.calls.append(("extend", [d.handle for d in deliveries]))
        return ()

    async def disconnect(self) -> None:
        self.calls.append(("disconnect", []))


async def acks_sent(producer: RecordedBroker, timeout: float = 5.0) -> None:
    """Wait until no ACK is queued or on the wire (they are sent in the background)."""
    deadline = asyncio.get_running_loop().time() + timeout
    while len(producer._acks):
        assert asyncio.get_running_loop().time() < deadline, "the queued ACKs were not sent"
        await asyncio.sleep(0.01)


async def take(producer: RecordedBroker, count: int) -> list[Any]:
    stream = producer.open_stream()
    payloads = [(await anext(stream))[1] for _ in range(count)]
    producer._test_stream = stream  # type: ignore[attr-defined]
    return payloads


def items(payloads: list[Any], *outcomes: AdvanceOutcome) -> list[AdvanceItem]:
    return [AdvanceItem(broker_payload=p, outcome=o) for p, o in zip(payloads, outcomes, strict=True)]


async def test_a_redelivery_holds_back_every_later_in_flight_message_of_its_lane():
    producer = RecordedBroker([("a1", "A", "x"), ("a2", "A", "x"), ("b1", "B", "x"), ("a3", "A", "x")])
    a1, a2, b1, a3 = await take(producer, 4)
    assert producer.get_advance_lane(a1) == producer.get_advance_lane(a3) != producer.get_advance_lane(b1)
    await producer.advance(items([a1], FAILED))
    # a2 and a3 were acked by every watcher, but a1 comes back first: they must come back too.
    await producer.advance(items([a2, a3], ACKED, ACKED))
    await producer.advance(items([b1], ACKED))
    assert producer.calls == [("redeliver", ["a1"]), ("redeliver", ["a2", "a3"]), ("ack", ["b1"])]
    assert producer.in_flight == 0


async def test_messages_received_after_the_redelivery_are_not_held_back():
    producer = RecordedBroker([("a1", "A", "x"), ("a2", "A", "x")])
    a1, a2 = await take(producer, 2)
    await producer.advance(items([a1, a2], FAILED, ACKED))
    producer.waiting = [("a1", "A", "x"), ("a2", "A", "x")]
    stream = producer._test_stream  # type: ignore[attr-defined]
    again = [(await anext(stream))[1] for _ in range(2)]
    await producer.advance(items(again, ACKED, ACKED))
    assert producer.calls == [("redeliver", ["a1", "a2"]), ("ack", ["a1", "a2"])]


async def test_a_message_of_the_lane_received_but_not_handed_out_is_given_back_not_handed_out():
    producer = RecordedBroker([("a1", "A", "x"), ("a2", "A", "x"), ("b1", "B", "x")])
    stream = producer.open_stream()
    [(_, a1)] = [await anext(stream)]
    await producer.advance(items([a1], FAILED))
    # a2 came in a1's batch: later in lane A than a1, so it goes back; b1's lane had no redelivery.
    raw, b1 = await anext(stream)
    assert raw.label == "b1"
    assert producer.calls == [("redeliver", ["a1"]), ("redeliver", ["a2"])]
    assert producer.in_flight == 1, "a2's credit came back"
    assert producer.metrics._counts["redelivered"] == 2
    await producer.advance(items([b1], ACKED))
    await stream.aclose()
    await producer.aclose()


async def test_a_batch_received_after_the_redelivery_is_handed_out_and_the_record_is_dropped():
    producer = RecordedBroker([("a1", "A", "x")])
    stream = producer.open_stream()
    _, a1 = await anext(stream)
    await producer.advance(items([a1], FAILED))
    producer.waiting = [("a1", "A", "x"), ("a2", "A", "x")]
    again = [await anext(stream) for _ in range(2)]
    assert [raw.label for raw, _ in again] == ["a1", "a2"]
    assert producer.calls == [("redeliver", ["a1"])]
    producer.waiting = [("a3", "A", "x")]
    raw, _ = await anext(stream)  # a batch fully handed out with none waiting behind it clears the record
    assert raw.label == "a3"
    assert not producer._lanes.stamped
    await stream.aclose()
    await producer.aclose()


async def test_unordered_messages_share_the_lane_of_their_receive_call_and_are_not_held_back():
    producer = RecordedBroker([("m1", None, "x"), ("m2", None, "x")])
    m1, m2 = await take(producer, 2)
    assert producer.get_advance_lane(m1) == producer.get_advance_lane(m2)
    await producer.advance(items([m1, m2], FAILED, ACKED))
    await acks_sent(producer)
    # Unordered: the ACK is coalesced (sent now, in the background, because nothing else is in
    # flight), so it may follow the redelivery; what matters is that m2 is not held back behind m1.
    assert sorted(producer.calls) == [("ack", ["m2"]), ("redeliver", ["m1"])]


async def test_settlement_is_chunked_and_dead_letters_carry_their_reason():
    producer = RecordedBroker([(f"m{i}", None, "x") for i in range(5)])
    payloads = await take(producer, 5)
    payloads[4].delivery.message.rejections.append("trigger 7: reject expression 'body.bad' matched")
    await producer.advance(items(payloads, ACKED, ACKED, ACKED, ACKED, REJECTED))
    await acks_sent(producer)
    assert producer.calls == [
        ("dead_letter", ["m4:rejected"]),
        ("ack", ["m0", "m1"]),
        ("ack", ["m2", "m3"]),
    ]


async def test_credits_come_back_even_when_a_dead_letter_copy_fails():
    producer = RecordedBroker([("m0", None, "x"), ("m1", None, "x")], max_in_flight=2)
    payloads = await take(producer, 2)
    producer.fail_dead_letter = True
    with pytest.raises(RuntimeError, match="refused"):
        await producer.advance(items(payloads, REJECTED, ACKED))
    assert producer.in_flight == 0
    assert ("ack", ["m1"]) not in producer.calls, "nothing may be removed when a dead-letter copy failed"


async def test_a_batch_nobody_was_subscribed_to_backs_off_the_next_receive():
    producer = RecordedBroker([("m0", None, "x")])
    (m0,) = await take(producer, 1)
    await producer.advance(items([m0], NOBODY))
    assert producer._backoff.delay > 0
    (m0,) = [m0]
    producer.waiting = [("m0", None, "x")]
    stream = producer._test_stream  # type: ignore[attr-defined]
    started = asyncio.get_running_loop().time()
    again = (await anext(stream))[1]
    assert asyncio.get_running_loop().time() - started >= producer._backoff.delay * 0.9
    await producer.advance(items([again], ACKED))
    assert producer._backoff.delay == 0


def test_backoff_doubles_to_a_ceiling_and_resets():
    backoff = NoSubscriberBackoff(minimum=0.25, maximum=1.0, clock=lambda: 0.0)
    delays = []
    for _ in range(4):
        backoff.nobody_subscribed()
        delays.append(backoff.delay)
    assert delays == [0.25, 0.5, 1.0, 1.0]
    backoff.someone_subscribed()
    assert backoff.delay == 0


def test_chunks_are_bounded_by_count_and_bytes_and_an_oversize_item_goes_alone():
    sizes = {"a": 40, "b": 40, "c": 40, "big": 500, "d": 10}
    batches = list(chunked(["a", "b", "c", "big", "d"], max_count=10, max_bytes=100, size=sizes.__getitem__))
    assert batches == [["a", "b"], ["c"], ["big"], ["d"]]
    assert list(chunked(list("abcde"), max_count=2)) == [["a", "b"], ["c", "d"], ["e"]]


async def test_the_window_bounds_what_is_received():
    producer = RecordedBroker([(f"m{i}", None, "x") for i in range(10)], max_in_flight=3)
    stream = producer.open_stream()
    first = [(await anext(stream))[1] for _ in range(3)]
    blocked = asyncio.ensure_future(anext(stream))
    await asyncio.sleep(0.05)
    assert not blocked.done(), "a fourth message was received with three credits"
    await producer.advance(items(first[:1], ACKED))
    await asyncio.wait_for(blocked, 1.0)
    await stream.aclose()
    await producer.aclose()


async def test_an_unordered_ack_waits_for_a_batch_keeps_its_lease_and_is_sent_on_close():
    producer = RecordedBroker([("m0", None, "x"), ("m1", None, "x"), ("f0", "F", "x")])
    m0, _m1, f0 = await take(producer, 3)
    await producer.advance(items([m0], ACKED))
    assert producer.calls == [], "one ACK waits for a batch while m1 and f0 are in flight"
    assert producer._leases is not None
    assert "m0" in producer._leases, "the lease of a message waiting for its ACK is kept"
    await producer.advance(items([f0], ACKED))
    assert producer.calls == [("ack", ["f0"])], "an ordered lane is acked at once"
    await producer.aclose()
    assert ("ack", ["m0"]) in producer.calls, "aclose sends the queued ACKs"
    assert producer.calls.index(("ack", ["m0"])) < producer.calls.index(("disconnect", []))
    assert all("m1" not in handles for _, handles in producer.calls), "m1 was never advanced"


class LargeAckBatches(RecordedBroker):
    """A broker whose ACK call takes far more than the credit window (Pub/Sub: 1,000 ack ids)."""

    settle_batch_limit = 1000


async def test_acks_go_out_once_a_credit_window_of_them_is_queued():
    """
    A window's worth of ACKs is as full as a batch gets from one persistence cycle.

    Regression: with the broker's own limit (1,000) above the window (500), Pub/Sub's ACK batches
    never filled; with receives read ahead something was always in flight, so every ACK waited
    the whole linger (2 s), its lease renewed meanwhile.
    """
    producer = LargeAckBatches([(f"m{n}", None, "x") for n in range(4)], max_in_flight=2)
    stream = producer.open_stream()
    m0 = (await anext(stream))[1]
    m1 = (await anext(stream))[1]
    await producer.advance(items([m0], ACKED))
    m2 = (await anext(stream))[1]  # the credit m0 freed is taken again: something stays in flight
    await producer.advance(items([m1], ACKED))
    assert producer.credits.in_flight == 1
    await asyncio.wait_for(acks_sent(producer), timeout=0.5)  # not the 2 s linger
    assert producer.calls == [("ack", ["m0", "m1"])]
    await producer.advance(items([m2], ACKED))
    await stream.aclose()
    await producer.aclose()


async def test_a_queued_ack_keeps_the_handle_and_lease_not_the_message():
    """Envelopes kept for the linger outlived two GC generations: only the handle is needed."""
    producer = RecordedBroker([("m0", None, '{"n": 0}'), ("m1", None, "x")])
    m0, _m1 = await take(producer, 2)
    assert m0.delivery.message.envelope["body"] == {"n": 0}
    await producer.advance(items([m0], ACKED))
    (queued,) = producer._acks.queued
    assert (queued.handle, queued.lease, queued.message_id) == ("m0", "m0", "m0")
    assert queued.message is ACK_QUEUED, "the queued ACK dropped the message"
    held = {d.lease: d for d in producer.held_deliveries()}
    assert held["m0"] is queued, "lease renewals use the delivery the ACK queue holds"
    await producer._extend(["m0"], 30.0)
    assert producer.calls == [("extend", ["m0"])]
    await producer.aclose()
    assert ("ack", ["m0"]) in producer.calls


async def test_a_batch_of_unordered_acks_is_queued_counted_and_frees_its_credits():
    """The ACK-only path (no settlement plan): what the general path did for such a batch."""
    producer = RecordedBroker([("m0", None, "x"), ("m1", None, "x"), ("m2", None, "x")])
    m0, m1, _m2 = await take(producer, 3)
    await producer.advance(items([m0, m1], ACKED, AdvanceOutcome(acked=2, failed=0, rejected=0)))
    assert producer.credits.in_flight == 1
    assert producer.metrics._counts == {"received": 3, "acked": 2, "fanned_out": 3}
    assert [d.lease for d in producer._acks.queued] == ["m0", "m1"]
    assert producer._leases is not None
    assert "m0" in producer._leases, "a queued ACK keeps its lease until it is sent"
    await producer.aclose()
    assert ("ack", ["m0", "m1"]) in producer.calls


async def test_only_a_batch_of_unordered_acks_takes_the_ack_only_path():
    """Any failure, reject, nobody or ordered lane in the batch sends it to the general path."""
    producer = RecordedBroker([("m0", None, "x"), ("m1", None, "x"), ("f0", "F", "x")])
    m0, m1, f0 = await take(producer, 3)
    for outcome in (FAILED, REJECTED, NOBODY, AdvanceOutcome(acked=1, failed=1, rejected=0)):
        assert producer._queue_plain_acks(items([m0, m1], ACKED, outcome)) is None
    assert producer._queue_plain_acks(items([m0, f0], ACKED, ACKED)) is None, "ordered lanes ack inline"
    assert producer.credits.in_flight == 3, "a refused batch changes nothing"
    assert not producer._acks.queued
    assert m0.delivery.message is not ACK_QUEUED
    twice = AdvanceOutcome(acked=2, failed=0, rejected=0)
    assert producer._queue_plain_acks(items([m0, m1], ACKED, twice)) is True, "a full batch (of 2)"
    assert producer.metrics._counts["fanned_out"] == 3
    assert [d.lease for d in producer._acks.queued] == ["m0", "m1"]
    assert producer.credits.in_flight == 1
    await producer.aclose()


class TwoReceives(RecordedBroker):
    """Two receive calls in flight at once; each records how many credits it asked for."""

    receives_in_flight = 2

    def __init__(self, messages: list[tuple[str, str | None, str]], *, max_in_flight: int) -> None:
        super().__init__(messages, max_in_flight=max_in_flight)
        self.asked: list[int] = []
        self.concurrent = 0
        self.most_concurrent = 0

    async def receive(self, max_messages: int) -> Sequence[Delivery[str]]:
        self.asked.append(max_messages)
        self.concurrent += 1
        self.most_concurrent = max(self.most_concurrent, self.concurrent)
        try:
            await asyncio.sleep(0.01)  # a round trip, so the two overlap
            return await super().receive(max_messages)
        finally:
            self.concurrent -= 1


async def test_two_receives_overlap_each_ask_for_a_share_and_every_message_comes_once():
    producer = TwoReceives([(f"m{i:02d}", None, "x") for i in range(40)], max_in_flight=20)
    stream = producer.open_stream()
    seen: list[str] = []
    for _ in range(40):
        _message, payload = await anext(stream)
        seen.append(payload.delivery.message_id)
        assert producer.credits.in_flight + producer.credits._reserved <= 20
        await producer.advance(items([payload], ACKED))
    assert sorted(seen) == [f"m{i:02d}" for i in range(40)]
    assert producer.most_concurrent == 2
    assert max(producer.asked) <= 10, "a receive asked for more than its share of the window"
    await stream.aclose()
    await producer.aclose()


async def test_a_receive_held_open_does_not_hold_back_the_batch_of_the_other():
    producer = TwoReceives([(f"m{i}", None, "x") for i in range(4)], max_in_flight=4)
    calls = 0
    plain_receive = producer.receive

    async def first_one_hangs(max_messages: int) -> Sequence[Delivery[str]]:
        nonlocal calls
        calls += 1
        if calls == 1:
            await asyncio.sleep(30)  # a long poll the broker holds open
            return []
        return await plain_receive(max_messages)

    producer.receive = first_one_hangs  # type: ignore[method-assign]
    stream = producer.open_stream()
    _, payload = await asyncio.wait_for(anext(stream), 2.0)
    assert payload.delivery.message_id == "m0"
    await stream.aclose()
    await producer.aclose()


async def test_receives_read_ahead_never_hold_more_than_the_window():
    producer = TwoReceives([(f"m{i}", None, "x") for i in range(30)], max_in_flight=6)
    stream = producer.open_stream()
    held = [(await anext(stream))[1] for _ in range(3)]
    await asyncio.sleep(0.1)  # every receive that could start has finished
    assert producer.credits.in_flight + producer.credits._reserved <= 6
    assert len(producer.held_deliveries()) <= 6, "received past the window"
    await producer.advance(items(held, ACKED, ACKED, ACKED))
    await stream.aclose()
    await producer.aclose()


async def test_a_window_of_one_with_two_receives_does_not_deadlock():
    producer = TwoReceives([(f"m{i}", None, "x") for i in range(5)], max_in_flight=1)
    stream = producer.open_stream()
    for _ in range(5):
        _, payload = await asyncio.wait_for(anext(stream), 2.0)
        await producer.advance(items([payload], ACKED))
    await stream.aclose()
    await producer.aclose()
    assert producer.credits.in_flight == 0
    assert producer.credits._reserved == 0


async def test_a_failed_receive_frees_its_reserved_credits():
    producer = TwoReceives([], max_in_flight=4)

    async def refused(max_messages: int) -> Sequence[Delivery[str]]:
        raise ConnectionError("the broker went away")

    producer.receive = refused  # type: ignore[method-assign]
    stream = producer.open_stream()
    with pytest.raises(ConnectionError):
        await anext(stream)
    assert producer.credits._reserved == 0
    assert producer.credits.in_flight == 0
    await producer.aclose()
