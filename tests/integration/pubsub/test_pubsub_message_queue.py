"""
Pub/Sub watchers declared through ``MessageQueueTrigger(scheme="shared+pubsub")``, against the emulator.

The contract reads what the emulator accepted through the recording producer
(tests/integration/pubsub/recording.py); ``MessageQueueTrigger`` builds the plain
``PubSubSharedStreamTrigger``, so the recording producer is put on that class for these tests.
"""

from __future__ import annotations

import pytest

from airflow_shared_stream.pubsub.trigger import PubSubSharedStreamTrigger
from tests.integration.contract.message_queue import MessageQueueContract
from tests.integration.pubsub.broker import PubSubContractBroker
from tests.integration.pubsub.recording import RecordingProducer

pytestmark = pytest.mark.integration


class TestPubSubMessageQueue(MessageQueueContract):
    scheme = "shared+pubsub"

    @pytest.fixture
    def contract_broker(self, pubsub, monkeypatch) -> PubSubContractBroker:
        monkeypatch.setattr(PubSubSharedStreamTrigger, "producer_class", RecordingProducer)
        return PubSubContractBroker(pubsub)
