"""Service Bus watchers declared through ``MessageQueueTrigger(scheme="shared+servicebus")``."""

from __future__ import annotations

import pytest

from tests.integration.contract.message_queue import MessageQueueContract
from tests.integration.servicebus.broker import ServiceBusContractBroker

pytestmark = pytest.mark.integration


class TestServiceBusMessageQueue(MessageQueueContract):
    scheme = "shared+servicebus"

    @pytest.fixture
    def contract_broker(self, servicebus, servicebus_connection) -> ServiceBusContractBroker:
        return ServiceBusContractBroker(servicebus)
