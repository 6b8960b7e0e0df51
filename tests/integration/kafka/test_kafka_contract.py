"""
Kafka passes the shared-stream contract (tests/integration/contract) against noida-db and Tansu
(the adapter: broker.py).
"""

from __future__ import annotations

import asyncio

import pytest

from airflow_shared_stream.testing import SharedStreamHarness
from tests.integration.contract.close import CloseContract
from tests.integration.contract.connection import ConnectionContract
from tests.integration.contract.ordered_lanes import OrderedLanesContract
from tests.integration.contract.shape_conflict import ShapeConflictContract
from tests.integration.contract.stream import SharedStreamContract
from tests.integration.contract.telemetry import TelemetryContract
from tests.integration.kafka.broker import KafkaContractBroker
from tests.support.brokers import EventLoopThread

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]


class TestKafkaContract(
    SharedStreamContract,
    OrderedLanesContract,
    ConnectionContract,
    TelemetryContract,
    ShapeConflictContract,
    CloseContract,
):
    @pytest.fixture
    def contract_broker(self, kafka):
        loop = EventLoopThread("kafka-contract-clients")
        try:
            yield KafkaContractBroker(kafka, loop)
        finally:
            loop.close()

    async def test_a_failed_dead_letter_copy_keeps_the_message_on_the_stream(self, contract_broker, request):
        if contract_broker.kafka.broker.name == "tansu":
            # Strict: if Tansu stops re-creating deleted topics, this turns red and the marker goes.
            request.applymarker(
                pytest.mark.xfail(
                    strict=True,
                    reason="Tansu re-creates a deleted topic when a record is produced to it, so the "
                    "dead-letter copy cannot be made to fail there (noida-db runs this test)",
                )
            )
        await super().test_a_failed_dead_letter_copy_keeps_the_message_on_the_stream(contract_broker)

    async def test_a_redelivery_holds_back_the_rest_of_its_lane(self, contract_broker):
        """
        The contract's test, each round of the lane checked for order instead of counting rounds.

        Kafka redelivers at once (a seek back), before the retried watcher joins; that watcher
        joins behind and seeks the partition back to its own position, so the fast watcher may
        see the lane once more than on a leased queue. What the contract guards, that nothing
        of the lane overtakes the redelivered message, holds round by round.
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
        rounds = len(order) // 2
        assert rounds >= 2, f"the redelivered message never came back: {order}"
        assert order == [1, 2] * rounds, f"the lane was handed back out of order: {order}"
