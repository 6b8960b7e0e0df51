"""
The behaviour every broker's shared stream shows (:class:`SharedStreamContract`).

In the style of FastStream's ``tests/brokers/base/``: written once, run by each broker's suite
against its real broker through its :class:`~tests.integration.contract.broker.ContractBroker`.
Every test is named after the bug it catches, and ``scripts/mutants.py`` proves it does: it
applies each deliberate mutant (delete on receipt, no credit window, dead-letter after the
delete, dead-letter skipped when the send fails, leases not renewed) to a copy of the package
and checks that this suite fails.
"""

from __future__ import annotations

import asyncio
import collections
from typing import Any

import pytest
from airflow.triggers.shared_stream import AdvanceItem

from airflow_shared_stream.testing import SharedStreamHarness
from tests.integration.contract.broker import NOBODY, ContractBroker, ids
from tests.support.waiting import eventually

pytestmark = pytest.mark.integration


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
            assert len(harness.manager._groups) == 1, "watchers of one upstream got consumers of their own"
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
