"""
SQS passes the shared-stream contract (tests/integration/contract) against moto's server (the
adapter: broker.py).
"""

from __future__ import annotations

import asyncio

import pytest

from airflow_shared_stream.testing import SharedStreamHarness
from tests.integration.contract.broker import ids
from tests.integration.contract.close import LEASE_SECONDS, CloseContract
from tests.integration.contract.connection import ConnectionContract
from tests.integration.contract.delivery_budget import OrderedDeliveryBudgetContract
from tests.integration.contract.leases import LeasedQueueContract
from tests.integration.contract.ordered_lanes import OrderedLanesContract
from tests.integration.contract.shape_conflict import ShapeConflictContract
from tests.integration.contract.stream import SharedStreamContract
from tests.integration.contract.telemetry import LeaseTelemetryContract, TelemetryContract
from tests.integration.sqs.broker import SqsContractBroker

pytestmark = pytest.mark.integration


class TestSqsContract(
    SharedStreamContract,
    OrderedLanesContract,
    OrderedDeliveryBudgetContract,
    LeasedQueueContract,
    ConnectionContract,
    TelemetryContract,
    LeaseTelemetryContract,
    ShapeConflictContract,
    CloseContract,
):
    @pytest.fixture
    def contract_broker(self, sqs, aws_connection) -> SqsContractBroker:
        return SqsContractBroker(sqs)

    async def test_a_closing_stream_gives_back_more_than_one_batch_call(self, contract_broker):
        """
        SQS takes at most 10 entries per ChangeMessageVisibilityBatch, so the close gives back in
        tens, every one of them (moto takes more than ten: the limit itself is not checked here).
        """
        broker = contract_broker
        stream = broker.create_stream(lease_seconds=LEASE_SECONDS)
        trigger = broker.trigger(stream, max_in_flight=25)
        producer = type(trigger).create_shared_stream_producer(trigger.serialize()[1])
        sent = broker.publish(stream, [{"n": n} for n in range(25)])
        events = producer.open_stream()
        try:
            for _ in sent:
                await asyncio.wait_for(anext(events), timeout=30)
        finally:
            await events.aclose()
            await producer.aclose()
        async with SharedStreamHarness(confirm_after=0.0) as harness:
            later = harness.add(broker.trigger(stream))
            await later.wait_for_events(len(sent), timeout=LEASE_SECONDS / 3)
        assert sorted(ids(broker, later)) == sorted(sent)
