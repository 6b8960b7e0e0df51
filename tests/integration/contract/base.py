"""
The shared-stream contract every broker passes against its real broker.

In the style of FastStream's ``tests/brokers/base/``: the behaviour is written once, here; each
broker's integration suite subclasses :class:`SharedStreamContract` and supplies one fixture,
``contract_broker``, returning a :class:`ContractBroker` (publish, read settled state, make a
trigger). A broker with ordered lanes also subclasses :class:`OrderedLanesContract`.

Every test here is named after the bug it catches, and ``scripts/mutants.py`` proves it does:
it applies each deliberate mutant (delete on receipt, no credit window, dead-letter after the
delete, dead-letter skipped when the send fails, one lane per message, leases not renewed) to a
copy of the package and checks that this suite fails.
"""

from __future__ import annotations

import abc
import asyncio
import collections
from typing import Any

import pytest
from airflow.triggers.shared_stream import AdvanceItem, AdvanceOutcome

from airflow_shared_stream.common.trigger import SharedStreamTrigger
from airflow_shared_stream.testing import SharedStreamHarness, Watcher
from tests.support.waiting import eventually

pytestmark = pytest.mark.integration

NOBODY = AdvanceOutcome(acked=0, failed=0, rejected=0)


class ContractBroker(abc.ABC):
    """What a broker's suite supplies to run the contract: one real upstream per test."""

    lease_seconds_min: int = 2
    """The shortest lease the broker grants (SQS visibility 2 s; Pub/Sub ack deadline 10 s)."""

    @abc.abstractmethod
    def create_stream(
        self, *, dead_letter: bool = True, lease_seconds: int = 30, ordered: bool = False
    ) -> Any:
        """A fresh upstream (queue / subscription / entity), with a dead-letter destination."""

    @abc.abstractmethod
    def publish(self, stream: Any, bodies: list[Any], *, lane: str | None = None) -> list[str]:
        """Publish JSON bodies (in order, in one lane if given); return their message ids."""

    @abc.abstractmethod
    def message_id(self, payload: dict[str, Any]) -> str:
        """The message id in a trigger event payload (the envelope)."""

    @abc.abstractmethod
    def remaining(self, stream: Any) -> int:
        """Messages still on the upstream, leased or not (not yet acked or dead-lettered)."""

    @abc.abstractmethod
    def leased(self, stream: Any) -> int:
        """Messages currently leased to a consumer (received, not settled, lease not expired)."""

    @abc.abstractmethod
    def dead_letters(self, stream: Any) -> list[Any]:
        """Take the decoded bodies that reached the dead-letter destination so far."""

    @abc.abstractmethod
    def break_dead_letter(self, stream: Any) -> None:
        """Make every dead-letter copy from now on fail (delete the DLQ, revoke the topic...)."""

    @abc.abstractmethod
    def trigger(self, stream: Any, **kwargs: Any) -> SharedStreamTrigger:
        """This broker's trigger on ``stream`` (kwargs: match, reject, max_in_flight...)."""


def ids(broker: ContractBroker, watcher: Watcher) -> list[str]:
    return [broker.message_id(p) for p in watcher.payloads]


class SharedStreamContract:
    """The behaviour every broker's shared stream must show (subclass with ``contract_broker``)."""

    @pytest.fixture
    def contract_broker(self) -> ContractBroker:  # pragma: no cover - every broker overrides it
        raise NotImplementedError

    async def test_fan_out_to_watchers_with_different_match(self, contract_broker):
        broker = contract_broker
        stream = broker.create_stream()
        async with SharedStreamHarness(confirm_after=0.0) as harness:
            everything = harness.add(broker.trigger(stream))
            even = harness.add(broker.trigger(stream, match="contains(`[0, 2, 4, 6, 8]`, body.n)"))
            big = harness.add(broker.trigger(stream, match="body.n >= `8`"))
            sent = broker.publish(stream, [{"n": i} for i in range(10)])
            await everything.wait_for_events(10)
            await even.wait_for_events(5)
            await big.wait_for_events(2)
            await eventually(lambda: broker.remaining(stream), lambda r: r == 0, timeout=30, what="acked")
        assert sorted(ids(broker, everything)) == sorted(sent)
        assert sorted(p["body"]["n"] for p in even.payloads) == [0, 2, 4, 6, 8]
        assert sorted(p["body"]["n"] for p in big.payloads) == [8, 9]

    async def test_advance_only_after_persistence(self, contract_broker):
        broker = contract_broker
        stream = broker.create_stream()
        async with SharedStreamHarness(confirm_after=None) as harness:
            watcher = harness.add(broker.trigger(stream))
            broker.publish(stream, [{"n": i} for i in range(5)])
            await watcher.wait_for_events(5)
            await asyncio.sleep(1.0)
            assert broker.remaining(stream) == 5, "a message was settled before its event was persisted"
            harness.confirm()
            await eventually(lambda: broker.remaining(stream), lambda r: r == 0, timeout=30, what="acked")

    async def test_credit_window_bounds_what_is_received_from_the_broker(self, contract_broker):
        broker = contract_broker
        stream = broker.create_stream()
        broker.publish(stream, [{"n": i} for i in range(30)])
        async with SharedStreamHarness(confirm_after=None) as harness:
            watcher = harness.add(broker.trigger(stream, max_in_flight=5))
            await watcher.wait_for_events(5)
            for _ in range(6):  # sampled over time: a window that leaks shows up in one sample
                await asyncio.sleep(0.3)
                assert len(watcher.events) == 5
                assert broker.leased(stream) <= 5
            harness.confirm_after = 0.0
            await watcher.wait_for_events(30, timeout=60)

    async def test_reject_and_oversize_go_to_the_dead_letter_path(self, contract_broker):
        broker = contract_broker
        stream = broker.create_stream()
        async with SharedStreamHarness(confirm_after=0.0) as harness:
            watcher = harness.add(broker.trigger(stream, reject="body.bad", max_payload_bytes=1000))
            broker.publish(stream, [{"n": 1}, {"bad": True}, {"blob": "x" * 2000}, {"n": 2}])
            await watcher.wait_for_events(2)
            await eventually(lambda: broker.remaining(stream), lambda r: r == 0, timeout=30, what="settled")
            dead: list[Any] = []

            def collect() -> list[Any]:
                dead.extend(broker.dead_letters(stream))
                return list(dead)

            await eventually(collect, lambda d: len(d) == 2, timeout=20, what="two dead letters")
        assert [p["body"] for p in watcher.payloads] == [{"n": 1}, {"n": 2}]
        assert sorted(str(d) for d in dead) == sorted(str(d) for d in [{"bad": True}, {"blob": "x" * 2000}])

    async def test_a_failed_dead_letter_copy_keeps_the_message_on_the_stream(self, contract_broker):
        broker = contract_broker
        stream = broker.create_stream(lease_seconds=broker.lease_seconds_min)
        async with SharedStreamHarness(confirm_after=0.0) as harness:
            watcher = harness.add(broker.trigger(stream, reject="body.bad"))
            broker.publish(stream, [{"n": 1}])
            await watcher.wait_for_events(1)
            await eventually(lambda: broker.remaining(stream), lambda r: r == 0, timeout=30, what="acked")
            broker.break_dead_letter(stream)
            broker.publish(stream, [{"bad": True}])
            await watcher.wait_for_error(timeout=30)  # the copy failed: the stream fails loudly
            # ...and the rejected message is still there, over several samples (not just one).
            for _ in range(5):
                assert broker.remaining(stream) == 1, "a message left the stream without its dead-letter copy"
                await asyncio.sleep(0.4)

    async def test_ack_timeout_redelivers_to_the_failed_watcher_only(self, contract_broker):
        broker = contract_broker
        stream = broker.create_stream()
        async with SharedStreamHarness(confirm_after=None, ack_timeout=2.0) as harness:
            slow = harness.add(broker.trigger(stream, match="body.n == `1`"))
            fast = harness.add(broker.trigger(stream))
            [message_id] = broker.publish(stream, [{"n": 1}])
            await slow.wait_for_events(1)
            await fast.wait_for_events(1)
            harness.confirm(watcher=fast)
            error = await slow.wait_for_error(timeout=15)
            assert type(error).__name__ == "AckTimeout"
            retried = harness.add(broker.trigger(stream, match="body.n == `1`"))
            await retried.wait_for_events(1, timeout=30)
            assert ids(broker, retried) == [message_id]
            harness.confirm()
            await fast.wait_for_events(2, timeout=30)
            harness.confirm()
            await eventually(lambda: broker.remaining(stream), lambda r: r == 0, timeout=30, what="acked")
            # At-least-once: the watcher that had persisted it sees it once more, not forever.
            assert ids(broker, fast) == [message_id, message_id]

    async def test_a_message_nobody_was_subscribed_to_comes_back(self, contract_broker):
        broker = contract_broker
        stream = broker.create_stream(lease_seconds=300)
        trigger = broker.trigger(stream)
        producer = type(trigger).create_shared_stream_producer(trigger.serialize()[1])
        [message_id] = broker.publish(stream, [{"n": 1}])
        events = producer.open_stream()
        try:
            raw, payload = await asyncio.wait_for(anext(events), timeout=30)
            assert broker.message_id(raw.envelope) == message_id
            await producer.advance([AdvanceItem(payload, NOBODY)])
            raw, _ = await asyncio.wait_for(anext(events), timeout=30)
            assert broker.message_id(raw.envelope) == message_id
        finally:
            await events.aclose()
            await producer.aclose()

    async def test_restart_without_loss(self, contract_broker):
        broker = contract_broker
        stream = broker.create_stream(lease_seconds=broker.lease_seconds_min)
        sent = broker.publish(stream, [{"n": i} for i in range(40)])
        seen: collections.Counter[str] = collections.Counter()
        async with SharedStreamHarness(confirm_after=0.5) as first:
            watcher = first.add(broker.trigger(stream, max_in_flight=10))
            await watcher.wait_for_events(15)
            seen.update(ids(broker, watcher))
        async with SharedStreamHarness(confirm_after=0.1) as second:
            watcher = second.add(broker.trigger(stream, max_in_flight=10))
            await eventually(
                lambda: set(seen) | set(ids(broker, watcher)),
                lambda s: s == set(sent),
                timeout=90,
                what="every message after the restart",
            )
            await eventually(lambda: broker.remaining(stream), lambda r: r == 0, timeout=60, what="drained")

    async def test_lease_held_past_the_brokers_own_timeout(self, contract_broker):
        broker = contract_broker
        lease = broker.lease_seconds_min
        stream = broker.create_stream(lease_seconds=lease)
        async with SharedStreamHarness(confirm_after=lease * 3.5) as harness:
            watcher = harness.add(broker.trigger(stream))
            sent = broker.publish(stream, [{"n": i} for i in range(3)])
            await watcher.wait_for_events(3)
            await eventually(
                lambda: broker.remaining(stream), lambda r: r == 0, timeout=lease * 10, what="acked"
            )
            await asyncio.sleep(lease * 1.5)
        assert sorted(ids(broker, watcher)) == sorted(sent), "a message was redelivered while still held"


class OrderedLanesContract:
    """For brokers with ordered lanes (SQS FIFO groups, Pub/Sub ordering keys, Service Bus sessions)."""

    async def test_a_redelivery_holds_back_the_rest_of_its_lane(self, contract_broker):
        broker = contract_broker
        stream = broker.create_stream(ordered=True)
        broker.publish(stream, [{"seq": 1}, {"seq": 2}], lane="g")
        async with SharedStreamHarness(confirm_after=None, ack_timeout=2.0) as harness:
            slow = harness.add(broker.trigger(stream, match="body.seq == `1`"))
            fast = harness.add(broker.trigger(stream))
            await fast.wait_for_events(2)
            await slow.wait_for_events(1)
            harness.confirm(watcher=fast)
            await slow.wait_for_error(timeout=15)
            retried = harness.add(broker.trigger(stream, match="body.seq == `1`"))
            await retried.wait_for_events(1, timeout=30)
            for _ in range(80):
                harness.confirm()
                if broker.remaining(stream) == 0 and len(fast.payloads) >= 4:
                    break
                await asyncio.sleep(0.25)
        order = [p["body"]["seq"] for p in fast.payloads]
        assert order == [1, 2, 1, 2], f"the lane was handed back out of order: {order}"

    async def test_a_message_received_but_not_yet_handed_out_is_held_back_behind_a_redelivery(
        self, contract_broker
    ):
        """
        Regression: the hold-back covered only messages already handed out.

        One receive brings 1 and 2 of a lane; 1 is handed out and fails before 2 is handed out.
        2 was received before the redelivery, so it is later in the lane than 1: handed out now,
        it overtook 1 (and could be acked before 1 was ever processed).
        """
        broker = contract_broker
        stream = broker.create_stream(ordered=True, lease_seconds=60)
        broker.publish(stream, [{"seq": 1}, {"seq": 2}], lane="g")
        trigger = broker.trigger(stream, max_in_flight=10)
        producer = type(trigger).create_shared_stream_producer(trigger.serialize()[1])
        events = producer.open_stream()
        seen: list[tuple[int, Any]] = []
        try:
            raw, payload = await asyncio.wait_for(anext(events), timeout=30)
            assert raw.envelope["body"] == {"seq": 1}
            await producer.advance([AdvanceItem(payload, AdvanceOutcome(acked=0, failed=1, rejected=0))])
            while len(seen) < 2:
                raw, payload = await asyncio.wait_for(anext(events), timeout=30)
                seen.append((raw.envelope["body"]["seq"], payload))
            await producer.advance(
                [AdvanceItem(p, AdvanceOutcome(acked=1, failed=0, rejected=0)) for _, p in seen]
            )
        finally:
            await events.aclose()
            await producer.aclose()
        assert [seq for seq, _ in seen] == [1, 2], (
            f"the lane was handed out out of order: 1, then {[seq for seq, _ in seen]}"
        )
        await eventually(lambda: broker.remaining(stream), lambda r: r == 0, timeout=30, what="acked")
