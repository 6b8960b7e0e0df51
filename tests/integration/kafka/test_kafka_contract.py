"""
Kafka passes the shared-stream contract (tests/integration/contract) against noida-db and Tansu
(the adapter: broker.py).
"""

from __future__ import annotations

import pytest

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
