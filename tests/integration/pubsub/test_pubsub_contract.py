"""
Pub/Sub passes the shared-stream contract (tests/integration/contract) against Google's emulator
(the adapter: broker.py).
"""

from __future__ import annotations

import pytest

from tests.integration.contract.close import CloseContract
from tests.integration.contract.connection import ConnectionContract
from tests.integration.contract.delivery_budget import DeliveryBudgetContract
from tests.integration.contract.leases import LeasedQueueContract
from tests.integration.contract.ordered_lanes import OrderedLanesContract
from tests.integration.contract.shape_conflict import ShapeConflictContract
from tests.integration.contract.stream import SharedStreamContract
from tests.integration.contract.telemetry import LeaseTelemetryContract, TelemetryContract
from tests.integration.pubsub.broker import PubSubContractBroker

pytestmark = pytest.mark.integration


class TestPubSubContract(
    SharedStreamContract,
    OrderedLanesContract,
    DeliveryBudgetContract,
    LeasedQueueContract,
    ConnectionContract,
    TelemetryContract,
    LeaseTelemetryContract,
    ShapeConflictContract,
    CloseContract,
):
    @pytest.fixture
    def contract_broker(self, pubsub) -> PubSubContractBroker:
        return PubSubContractBroker(pubsub)
