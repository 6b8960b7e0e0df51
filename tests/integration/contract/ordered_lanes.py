"""Ordered lanes keep their order through redeliveries (:class:`OrderedLanesContract`)."""

from __future__ import annotations

import asyncio
import collections
import random
from typing import Any

import pytest
from airflow.triggers.shared_stream import AdvanceItem, AdvanceOutcome

from airflow_shared_stream.testing import SharedStreamHarness
from tests.support.waiting import eventually

pytestmark = pytest.mark.integration


class OrderedLanesContract:
    """
    For brokers with ordered lanes: SQS FIFO groups, Pub/Sub ordering keys, Service Bus sessions,
    Kafka partitions.
    """

    async def test_each_lane_keeps_its_order_through_uneven_persistence(self, contract_broker):
        broker = contract_broker
        stream = broker.create_stream(ordered=True)
        lanes = ("a", "b", "c")
        rng = random.Random(7)
        async with SharedStreamHarness(confirm_after=lambda: rng.uniform(0.0, 0.3)) as harness:
            first = harness.add(broker.trigger(stream))
            second = harness.add(broker.trigger(stream, match="body.seq >= `0`"))
            for lane in lanes:
                broker.publish(stream, [{"lane": lane, "seq": i} for i in range(10)], lane=lane)
            for watcher in (first, second):
                await watcher.wait_for_events(30, timeout=120)
            await eventually(lambda: broker.remaining(stream), lambda r: r == 0, timeout=60, what="acked")
        for watcher in (first, second):
            per_lane = collections.defaultdict(list)
            for payload in watcher.payloads:
                per_lane[payload["body"]["lane"]].append(payload["body"]["seq"])
            assert per_lane == {lane: list(range(10)) for lane in lanes}, per_lane

    async def test_a_redelivery_holds_back_the_rest_of_its_lane(self, contract_broker):
        """
        Each time the lane is handed out again, it comes in its order: nothing later in the lane
        overtakes the redelivered message.

        Checked round by round; a leased queue hands the lane out exactly twice, while Kafka may
        hand it out once more (``redelivers_a_lane_once``): it seeks back at once, before the
        retried watcher joins, and that watcher joins behind and seeks the partition back to its
        own position, a duplicate at-least-once allows, not a lane out of order.
        """
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
        rounds = [order[start : start + 2] for start in range(0, len(order), 2)]
        assert len(rounds) >= 2, f"the redelivered message never came back: {order}"
        if broker.redelivers_a_lane_once:
            assert len(rounds) == 2, f"one redelivery handed the lane out more than once more: {order}"
        assert all(lane == [1, 2] for lane in rounds), f"the lane was handed back out of order: {order}"

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
