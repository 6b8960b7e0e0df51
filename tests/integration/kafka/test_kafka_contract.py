"""
Kafka passes the shared-stream contract (tests/integration/contract) against noida-db and Tansu.

The contract is written against synchronous broker helpers; aiokafka is asynchronous, so every
helper runs its coroutine on one event loop of its own, in a thread (:class:`_ClientLoop`).

Three Kafka facts shape the adapter:

* the envelope calls the body ``value`` (Kafka's word, and what users' ``match`` expressions
  read), the contract calls it ``body``: :class:`ContractKafkaTrigger` spells ``body.`` as
  ``value.`` in expressions and its producer adds a ``body`` alias to each envelope (so to its
  events' payloads), nothing else;
* Kafka has no leases: ``leased`` is 0 (the credit-window test still counts the events), and
  ``remaining`` is what the group has not committed past (published minus committed offset);
* every stream is one partition, and a partition is an ordered lane: the ordered-lanes contract
  holds for every stream (``ordered`` and ``lane`` change nothing).
"""

from __future__ import annotations

import asyncio
import json
import threading
import uuid
from collections.abc import AsyncIterator, Coroutine
from dataclasses import dataclass
from typing import Any, TypeVar

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from airflow_shared_stream.common.matching import RawMessage
from airflow_shared_stream.kafka import KafkaSharedStreamProducer, KafkaSharedStreamTrigger
from airflow_shared_stream.kafka.envelope import KafkaBrokerPayload
from airflow_shared_stream.testing import SharedStreamHarness
from tests.integration.contract.base import ContractBroker, OrderedLanesContract, SharedStreamContract

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

T = TypeVar("T")


class ContractKafkaProducer(KafkaSharedStreamProducer):
    """The Kafka producer, with the contract's word for the body in each envelope."""

    async def open_stream(self) -> AsyncIterator[tuple[RawMessage, KafkaBrokerPayload]]:
        stream = super().open_stream()
        try:
            async for raw, payload in stream:
                raw.envelope["body"] = raw.envelope.get("value")
                yield raw, payload
        finally:
            await stream.aclose()


class ContractKafkaTrigger(KafkaSharedStreamTrigger):
    """The Kafka trigger, with the contract's word for the body (see the module docstring)."""

    producer_class = ContractKafkaProducer

    def __init__(self, topics: Any, **kwargs: Any) -> None:
        for name in ("match", "reject"):
            if kwargs.get(name):
                kwargs[name] = kwargs[name].replace("body.", "value.")
        super().__init__(topics, **kwargs)


class _ClientLoop:
    """An event loop in a thread, for the contract's synchronous helpers."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(
            target=self.loop.run_forever, name="kafka-contract-clients", daemon=True
        )
        self.thread.start()

    def run(self, coro: Coroutine[Any, Any, T], timeout: float = 60) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


@dataclass
class KafkaStream:
    topic: str
    dead_letter_topic: str | None
    group: str
    published: int = 0
    dead_letters_taken: int = 0


class KafkaContractBroker(ContractBroker):
    lease_seconds_min = 2

    def __init__(self, kafka: Any, clients: _ClientLoop) -> None:
        self.kafka = kafka
        self.clients = clients
        # A shorter request timeout than aiokafka's 40 s, so a dead-letter send to a topic that is
        # gone fails well within the contract's wait; longer than Tansu's ~5 s first group join.
        self.conn_id = kafka.connection(
            "contract", **{"auto.offset.reset": "earliest", "request.timeout.ms": "12000"}
        )

    def create_stream(
        self, *, dead_letter: bool = True, lease_seconds: int = 30, ordered: bool = False
    ) -> KafkaStream:
        name = uuid.uuid4().hex[:8]
        topic = self.kafka.name(f"c{name}")
        dlq = self.kafka.name(f"c{name}-dlq") if dead_letter else None
        self.clients.run(self._create_topics([t for t in (topic, dlq) if t]))
        return KafkaStream(topic=topic, dead_letter_topic=dlq, group=f"{topic}-g")

    async def _create_topics(self, names: list[str]) -> None:
        admin = AIOKafkaAdminClient(bootstrap_servers=self.kafka.bootstrap)
        await admin.start()
        try:
            await admin.create_topics([NewTopic(n, num_partitions=1, replication_factor=1) for n in names])
        finally:
            await admin.close()

    def publish(self, stream: KafkaStream, bodies: list[Any], *, lane: str | None = None) -> list[str]:
        first = stream.published
        self.clients.run(self._produce(stream.topic, bodies))
        stream.published += len(bodies)
        return [f"{stream.topic}/0@{offset}" for offset in range(first, stream.published)]

    async def _produce(self, topic: str, bodies: list[Any]) -> None:
        producer = AIOKafkaProducer(
            bootstrap_servers=self.kafka.bootstrap, acks="all", max_request_size=2**21
        )
        await producer.start()
        try:
            for body in bodies:
                await producer.send(topic, json.dumps(body).encode(), partition=0)
            await producer.flush()
        finally:
            await producer.stop()

    def message_id(self, payload: dict[str, Any]) -> str:
        return f"{payload['topic']}/{payload['partition']}@{payload['offset']}"

    def remaining(self, stream: KafkaStream) -> int:
        committed = self.clients.run(self._committed(stream))
        return stream.published - (committed or 0)

    async def _committed(self, stream: KafkaStream) -> int | None:
        consumer = AIOKafkaConsumer(
            bootstrap_servers=self.kafka.bootstrap, group_id=stream.group, enable_auto_commit=False
        )
        await consumer.start()
        try:
            return await consumer.committed(TopicPartition(stream.topic, 0))
        finally:
            await consumer.stop()

    def leased(self, stream: KafkaStream) -> int:
        return 0  # Kafka has no leases; the credit-window test counts events instead

    def dead_letters(self, stream: KafkaStream) -> list[Any]:
        assert stream.dead_letter_topic is not None
        records = self.clients.run(self._read(stream.dead_letter_topic))
        fresh = records[stream.dead_letters_taken :]
        stream.dead_letters_taken = len(records)
        return [json.loads(r.value) for r in fresh]

    async def _read(self, topic: str) -> list[Any]:
        consumer = AIOKafkaConsumer(
            topic,
            bootstrap_servers=self.kafka.bootstrap,
            auto_offset_reset="earliest",
            enable_auto_commit=False,
        )
        await consumer.start()
        records: list[Any] = []
        try:
            while batch := await consumer.getmany(timeout_ms=1000):
                for recs in batch.values():
                    records.extend(recs)
            return records
        finally:
            await consumer.stop()

    def break_dead_letter(self, stream: KafkaStream) -> None:
        assert stream.dead_letter_topic is not None
        self.clients.run(self._delete_topic(stream.dead_letter_topic))

    async def _delete_topic(self, name: str) -> None:
        admin = AIOKafkaAdminClient(bootstrap_servers=self.kafka.bootstrap)
        await admin.start()
        try:
            await admin.delete_topics([name])
        finally:
            await admin.close()

    def trigger(self, stream: KafkaStream, **kwargs: Any) -> KafkaSharedStreamTrigger:
        return ContractKafkaTrigger(
            [stream.topic],
            kafka_config_id=self.conn_id,
            group_id=stream.group,
            dead_letter_topic=stream.dead_letter_topic,
            **kwargs,
        )


class TestKafkaContract(SharedStreamContract, OrderedLanesContract):
    @pytest.fixture
    def contract_broker(self, kafka):
        clients = _ClientLoop()
        try:
            yield KafkaContractBroker(kafka, clients)
        finally:
            clients.close()

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
