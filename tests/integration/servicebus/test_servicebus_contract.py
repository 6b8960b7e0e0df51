"""
Service Bus passes the shared-stream contract (tests/integration/contract) against the AMQP test
server (the adapter: broker.py).
"""

from __future__ import annotations

import pytest

from tests.integration.contract.close import CloseContract
from tests.integration.contract.connection import ConnectionContract
from tests.integration.contract.delivery_budget import OrderedDeliveryBudgetContract
from tests.integration.contract.leases import LeasedQueueContract
from tests.integration.contract.ordered_lanes import OrderedLanesContract
from tests.integration.contract.shape_conflict import ShapeConflictContract
from tests.integration.contract.stream import SharedStreamContract
from tests.integration.contract.telemetry import LeaseTelemetryContract, TelemetryContract
from tests.integration.servicebus.broker import ServiceBusContractBroker

pytestmark = pytest.mark.integration


class TestServiceBusContract(
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
    def contract_broker(self, servicebus, servicebus_connection) -> ServiceBusContractBroker:
        return ServiceBusContractBroker(servicebus)
