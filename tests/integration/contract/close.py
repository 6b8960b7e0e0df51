"""
A closing stream (its last watcher left, the triggerer stops) settles what is done, gives back the rest.

:class:`CloseContract`: what the manager advanced as done before the close is settled by the
close (an ACK still queued for its batch is sent, never undone); what is still in flight goes
back to the broker, so the next stream on the upstream gets it (at once where the broker
gives leases back on close, :attr:`ContractBroker.gives_back_on_close`; a broker without it lets
the lease run out), and gets nothing that was done.
"""

from __future__ import annotations

import asyncio

import pytest
from airflow.triggers.shared_stream import AdvanceItem, AdvanceOutcome

from airflow_shared_stream.testing import SharedStreamHarness
from tests.integration.contract.broker import ContractBroker, ids
from tests.support.waiting import eventually

pytestmark = pytest.mark.integration

LEASE_SECONDS = 120
"""Far longer than the next stream waits: a message that only comes back when its lease runs
out fails the test."""


class CloseContract:
    """Subclass with ``contract_broker``."""

    async def test_a_closing_stream_sends_what_was_done_and_gives_back_the_rest_at_once(
        self, contract_broker: ContractBroker, monkeypatch
    ):
        broker = contract_broker
        lease = LEASE_SECONDS if broker.gives_back_on_close else broker.lease_seconds_min
        back_within = LEASE_SECONDS / 3 if broker.gives_back_on_close else lease * 10 + 30
        stream = broker.create_stream(lease_seconds=lease)
        trigger = broker.trigger(stream)
        if hasattr(trigger.producer_class, "ack_linger_seconds"):
            # The ACK of the done message still waits for its batch when the stream closes.
            monkeypatch.setattr(trigger.producer_class, "ack_linger_seconds", LEASE_SECONDS)
        producer = type(trigger).create_shared_stream_producer(trigger.serialize()[1])
        done, in_flight = broker.publish(stream, [{"n": 1}, {"n": 2}])
        events = producer.open_stream()
        try:
            received = [await asyncio.wait_for(anext(events), timeout=30) for _ in range(2)]
            by_id = {broker.message_id(raw.envelope): payload for raw, payload in received}
            await producer.advance([AdvanceItem(by_id[done], AdvanceOutcome(acked=1, failed=0, rejected=0))])
        finally:
            await events.aclose()
            await producer.aclose()
        async with SharedStreamHarness(confirm_after=0.0) as harness:
            later = harness.add(broker.trigger(stream))
            await later.wait_for_events(1, timeout=back_within)
            await eventually(lambda: broker.remaining(stream), lambda r: r == 0, timeout=30, what="acked")
        assert ids(broker, later) == [in_flight], "the next stream got a message the closed one had done"
