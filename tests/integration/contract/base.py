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

DELIVERY_LIMIT = 5
"""The brokers' delivery limit in the delivery-budget tests (Pub/Sub's lowest ``max_delivery_attempts``)."""


class ContractBroker(abc.ABC):
    """What a broker's suite supplies to run the contract: one real upstream per test."""

    lease_seconds_min: int = 2
    """The shortest lease the broker grants (SQS visibility 2 s; Pub/Sub ack deadline 10 s)."""

    """Whether an ordered lane's messages that reached nobody are held too (Pub/Sub: no, an
    ordering key is not locked; see ``LeasedQueueProducer.hold_ordered_lanes``)."""

    give_back_spends_attempt: bool = True
    """Whether giving a held message back to the broker (a stream closing) spends one of its
    delivery attempts: SQS counts every receive and Pub/Sub every redelivery; Service Bus has an
    outcome that does not count (AMQP ``released``)."""

    @abc.abstractmethod
    def create_stream(
        self,
        *,
        dead_letter: bool = True,
        lease_seconds: int = 30,
        ordered: bool = False,
        max_deliveries: int | None = None,
    ) -> Any:
        """
        A fresh upstream (queue / subscription / entity), with a dead-letter destination.

        ``max_deliveries``: the broker's own delivery limit, past which it moves a message to the
        dead-letter destination itself (SQS ``maxReceiveCount``, a Pub/Sub dead-letter policy's
        ``max_delivery_attempts``, Service Bus ``MaxDeliveryCount``); ``None``: the default.
        """

    def attempts_spent(self, payload: dict[str, Any]) -> int:
        """Delivery attempts the broker counted against its limit before this delivery (0: none)."""
        raise NotImplementedError("only brokers that count deliveries run DeliveryBudgetContract")

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


class DeliveryBudgetContract:
    """
    A message no watcher has seen never spends a broker delivery attempt.

    A stuck watcher stays subscribed, but once the ack timeout failed it the manager leaves it
    out of the fan-out: every new message reaches nobody (an all-zero outcome). Given back each
    time, such a message came straight back and spent one of the broker's delivery attempts per
    round, and the broker dead-lettered it within a minute, unseen. Each broker runs these with
    its own delivery limit set low (:data:`DELIVERY_LIMIT`).
    """

    async def _hold_unseen_behind_a_stuck_watcher(
        self,
        broker: ContractBroker,
        stream: Any,
        harness: SharedStreamHarness,
        unstick: asyncio.Event,
        lane: str | None = None,
    ) -> tuple[Watcher, list[str]]:
        """
        Get a watcher stuck, publish two messages and wait until they have reached nobody more
        times than the broker's limit allows deliveries; return the stuck watcher and their ids.
        """

        async def hang(event: Any) -> None:
            await unstick.wait()

        stuck = harness.add(broker.trigger(stream), before_bind=hang)
        broker.publish(stream, [{"n": 0}], lane=lane)  # the watcher sees this one and hangs on it
        group = await eventually(
            lambda: harness.manager._groups.get(stuck.key),
            lambda g: g is not None and stuck.trigger_id in g._failed_subscribers,
            timeout=60,
            what="the ack timeout leaving the stuck watcher out of the fan-out",
        )
        first = group._next_event_id
        unseen = broker.publish(stream, [{"n": 1}, {"n": 2}], lane=lane)
        dead: list[Any] = []

        def offers_and_dead_letters() -> tuple[int, int]:
            dead.extend(broker.dead_letters(stream))
            return group._next_event_id - first, len(dead)

        # The three messages (the stuck one's comes back too) each reach nobody more often than
        # the broker allows deliveries, or the broker dead-letters them first.
        await eventually(
            offers_and_dead_letters,
            lambda seen: seen[0] >= 3 * (DELIVERY_LIMIT + 1) or seen[1] > 0,
            timeout=180,
            what="messages offered to nobody past the delivery limit",
        )
        assert not dead, f"the broker dead-lettered messages no watcher saw: {dead}"
        return stuck, unseen

    async def test_a_stuck_watcher_spends_no_delivery_attempt_of_messages_nobody_saw(self, contract_broker):
        broker = contract_broker
        stream = broker.create_stream(max_deliveries=DELIVERY_LIMIT)
        unstick = asyncio.Event()
        async with SharedStreamHarness(confirm_after=0.0, ack_timeout=2.0) as harness:
            try:
                _, unseen = await self._hold_unseen_behind_a_stuck_watcher(broker, stream, harness, unstick)
                back = harness.add(broker.trigger(stream))  # a watcher is back: it sees them all
                await back.wait_for_events(3, timeout=60)
                await eventually(lambda: broker.remaining(stream), lambda r: r == 0, timeout=60, what="acked")
            finally:
                unstick.set()
        assert set(unseen) <= set(ids(broker, back))
        spent = {broker.message_id(p): broker.attempts_spent(p) for p in back.payloads}
        assert [spent[i] for i in unseen] == [0, 0], f"delivery attempts spent while nobody saw them: {spent}"
        assert broker.dead_letters(stream) == []

    async def test_a_stream_whose_watchers_all_left_gives_back_what_nobody_saw(self, contract_broker):
        broker = contract_broker
        stream = broker.create_stream(max_deliveries=DELIVERY_LIMIT, lease_seconds=broker.lease_seconds_min)
        unstick = asyncio.Event()
        async with SharedStreamHarness(confirm_after=0.0, ack_timeout=2.0) as harness:
            try:
                hold = self._hold_unseen_behind_a_stuck_watcher
                stuck, unseen = await hold(broker, stream, harness, unstick)
                await harness.remove(stuck)  # the only watcher leaves: the stream closes
                assert stuck.key not in harness.manager._groups
            finally:
                unstick.set()
        async with SharedStreamHarness(confirm_after=0.0) as harness:
            later = harness.add(broker.trigger(stream))
            await later.wait_for_events(3, timeout=90)
            await eventually(lambda: broker.remaining(stream), lambda r: r == 0, timeout=60, what="acked")
        assert set(unseen) <= set(ids(broker, later))
        budget = 1 if broker.give_back_spends_attempt else 0  # the one give-back as the stream closed
        spent = {broker.message_id(p): broker.attempts_spent(p) for p in later.payloads}
        assert all(spent[i] <= budget for i in unseen), f"attempts spent past {budget}: {spent}"
        assert broker.dead_letters(stream) == []


class OrderedDeliveryBudgetContract(DeliveryBudgetContract):
    """
    The delivery-budget rule for an ordered lane: held whole, offered again in its order.

    For brokers that lock a lane while it is out (SQS FIFO groups, Service Bus sessions). Pub/Sub
    does not lock an ordering key, so its ordered lanes are given back at once and it does not
    subclass this (docs/pubsub.rst).
    """

    async def test_an_ordered_lane_nobody_saw_spends_no_delivery_attempt_and_keeps_its_order(
        self, contract_broker
    ):
        broker = contract_broker
        stream = broker.create_stream(max_deliveries=DELIVERY_LIMIT, ordered=True)
        unstick = asyncio.Event()
        async with SharedStreamHarness(confirm_after=0.0, ack_timeout=2.0) as harness:
            try:
                hold = self._hold_unseen_behind_a_stuck_watcher
                _, unseen = await hold(broker, stream, harness, unstick, lane="g")
                back = harness.add(broker.trigger(stream))
                await back.wait_for_events(3, timeout=60)
                await eventually(lambda: broker.remaining(stream), lambda r: r == 0, timeout=60, what="acked")
            finally:
                unstick.set()
        order = [p["body"]["n"] for p in back.payloads]
        assert order == [0, 1, 2], f"the lane came back out of order: {order}"
        spent = {broker.message_id(p): broker.attempts_spent(p) for p in back.payloads}
        assert [spent[i] for i in unseen] == [0, 0], f"delivery attempts spent while nobody saw them: {spent}"
        assert broker.dead_letters(stream) == []


class LeasedQueueContract:
    """Leases of the leased queues (SQS, Pub/Sub, Service Bus), held against the real broker."""

    async def test_a_queued_ack_keeps_its_lease_when_its_batch_also_settles_a_reject(
        self, contract_broker, monkeypatch
    ):
        """
        On the general advance path (a batch that also rejects or fails something) the ACKs are
        queued for the ACK batcher as on the plain one; their leases must stay renewed until the
        ACK is sent, or the broker hands the messages out again while they wait.
        """
        broker = contract_broker
        lease = broker.lease_seconds_min
        stream = broker.create_stream(lease_seconds=lease)
        trigger = broker.trigger(stream, reject="body.bad")
        # The ACKs wait for a fuller batch well past the lease (another message stays in flight).
        monkeypatch.setattr(trigger.producer_class, "ack_linger_seconds", lease * 3.0)
        seqs: dict[Any, int] = {}

        def on_bound(watcher: Watcher, seq: int | None, event: Any) -> None:
            if seq is not None:
                seqs[event.payload["body"].get("n")] = seq

        # Published before the stream starts, so one receive brings all three: one advance lane,
        # and the reject behind the two ACKs advances with them.
        broker.publish(stream, [{"n": 1}, {"n": 2}, {"bad": True}])
        async with SharedStreamHarness(confirm_after=None, on_bound=on_bound) as harness:
            watcher = harness.add(trigger)
            await watcher.wait_for_events(2)
            broker.publish(stream, [{"n": 3}])
            await watcher.wait_for_events(3)
            harness.confirm([seqs[1], seqs[2]])  # 1, 2 and the reject advance; 3 stays in flight
            dead: list[Any] = []

            def collect() -> list[Any]:
                dead.extend(broker.dead_letters(stream))
                return list(dead)

            await eventually(collect, lambda d: len(d) == 1, timeout=30, what="the reject dead-lettered")
            for _ in range(int(lease * 2.5 / 0.25)):  # sampled: a lapsed lease shows up as a redelivery
                await asyncio.sleep(0.25)
                assert len(watcher.events) == 3, "a message whose ACK was queued came back"
            harness.confirm()
            await eventually(lambda: broker.remaining(stream), lambda r: r == 0, timeout=60, what="acked")
        assert sorted(p["body"]["n"] for p in watcher.payloads) == [1, 2, 3]

    async def test_more_leases_than_one_settle_batch_are_all_renewed(self, contract_broker):
        """
        The lease keeper renews in chunks of the broker's batch limit (``settle_batch_limit``;
        SQS takes ten entries per ``ChangeMessageVisibilityBatch``): every chunk, not only the
        first, while more messages than one batch wait for persistence past the broker's lease.
        """
        broker = contract_broker
        lease = broker.lease_seconds_min
        stream = broker.create_stream(lease_seconds=lease)
        batch_limit = broker.trigger(stream).producer_class.settle_batch_limit
        count = batch_limit + 5
        sent = broker.publish(stream, [{"n": i} for i in range(count)])
        async with SharedStreamHarness(confirm_after=lease * 3.5) as harness:
            watcher = harness.add(broker.trigger(stream, max_in_flight=count + 5))
            await watcher.wait_for_events(count, timeout=120)
            await eventually(
                lambda: broker.remaining(stream), lambda r: r == 0, timeout=lease * 10 + 60, what="acked"
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
