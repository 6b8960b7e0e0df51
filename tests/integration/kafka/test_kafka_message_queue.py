"""Kafka watchers declared through ``MessageQueueTrigger(scheme="shared+kafka")``, on noida-db and Tansu."""

from __future__ import annotations

import pytest

from tests.integration.contract.message_queue import MessageQueueContract
from tests.integration.kafka.broker import KafkaContractBroker
from tests.support.brokers import EventLoopThread

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]


class TestKafkaMessageQueue(MessageQueueContract):
    scheme = "shared+kafka"

    @pytest.fixture
    def contract_broker(self, kafka):
        clients = EventLoopThread("kafka-contract-clients")
        try:
            yield KafkaContractBroker(kafka, clients)
        finally:
            clients.close()
