"""
The contract's names in one place, for suites that import them from here.

The contract lives in modules of one concern (broker, stream, delivery_budget, leases,
ordered_lanes, connection, telemetry, shape_conflict, close); new code imports from those.
"""

from __future__ import annotations

from tests.integration.contract.broker import DELIVERY_LIMIT, NOBODY, BrokenConnection, ContractBroker, ids
from tests.integration.contract.close import CloseContract
from tests.integration.contract.connection import ConnectionContract
from tests.integration.contract.delivery_budget import DeliveryBudgetContract, OrderedDeliveryBudgetContract
from tests.integration.contract.leases import LeasedQueueContract
from tests.integration.contract.ordered_lanes import OrderedLanesContract
from tests.integration.contract.shape_conflict import ShapeConflictContract
from tests.integration.contract.stream import SharedStreamContract
from tests.integration.contract.telemetry import LeaseTelemetryContract, TelemetryContract

__all__ = [
    "DELIVERY_LIMIT",
    "NOBODY",
    "BrokenConnection",
    "CloseContract",
    "ConnectionContract",
    "ContractBroker",
    "DeliveryBudgetContract",
    "LeaseTelemetryContract",
    "LeasedQueueContract",
    "OrderedDeliveryBudgetContract",
    "OrderedLanesContract",
    "ShapeConflictContract",
    "SharedStreamContract",
    "TelemetryContract",
    "ids",
]
