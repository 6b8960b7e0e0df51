"""SQS watchers declared through ``MessageQueueTrigger(scheme="shared+sqs")``, against moto's server."""

from __future__ import annotations

import pytest

from tests.integration.contract.message_queue import MessageQueueContract
from tests.integration.sqs.broker import SqsContractBroker

pytestmark = pytest.mark.integration


class TestSqsMessageQueue(MessageQueueContract):
    scheme = "shared+sqs"

    @pytest.fixture
    def contract_broker(self, sqs, aws_connection) -> SqsContractBroker:
        return SqsContractBroker(sqs)
