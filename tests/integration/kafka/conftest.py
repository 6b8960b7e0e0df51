"""
Real Kafka-protocol brokers for the Kafka suite: noida-db and Tansu, each started once per session.

Every test that takes ``kafka`` runs once per broker (the fixture is parametrized), because the
two disagree in different places and that is how protocol bugs show. A broker that cannot
start fails the session loudly. Each test gets fresh topics, a fresh connection id and fresh
consumer groups, so tests never see each other's offsets.
"""

from __future__ import annotations

import contextlib
import json
import tempfile
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.protocol.admin import DeleteGroupsRequest

from tests.support.kafka_brokers import KAFKA_BROKERS, KafkaBrokerProcess, run_kafka_broker

BROKERS = KAFKA_BROKERS


@pytest.fixture(scope="session", params=BROKERS)
def kafka_broker(request: pytest.FixtureRequest) -> Iterator[KafkaBrokerProcess]:
    name = request.param
    with run_kafka_broker(name, Path(tempfile.mkdtemp(prefix=f"kafka-{name}-"))) as broker:
        yield broker


@dataclass
class KafkaSandbox:
    """Per-test view of a broker: unique names, a connection id, and client helpers."""

    broker: KafkaBrokerProcess
    conn_id: str
    prefix: str
    monkeypatch: pytest.MonkeyPatch | None = None
    settings: dict[str, str] = field(default_factory=dict)
    """Settings every further :meth:`connection` carries, over its own (a reliability rig's
    session timeout or poll interval)."""

    def connection(self, what: str = "conn", **extra: str) -> str:
        """
        A further ``kafka`` connection to this broker, with ``extra`` on top of the defaults.

        For tests about settings the default connection does not carry (``auto.offset.reset``
        ``latest``, a ``group.id``, ``max.poll.interval.ms``). Returns the connection id.
        """
        assert self.monkeypatch is not None
        conn_id = f"kafka_{self.prefix}_{what}".replace("-", "_")
        settings = {"bootstrap.servers": self.bootstrap, "enable.auto.commit": "false", **extra}
        settings.update(self.settings)
        self.monkeypatch.setenv(
            f"AIRFLOW_CONN_{conn_id.upper()}", json.dumps({"conn_type": "kafka", "extra": settings})
        )
        return conn_id

    @property
    def bootstrap(self) -> str:
        return self.broker.bootstrap

    def name(self, what: str) -> str:
        return f"{self.prefix}-{what}"

    async def create_topics(self, *names: str, partitions: int = 1) -> None:
        admin = AIOKafkaAdminClient(bootstrap_servers=self.bootstrap)
        await admin.start()
        try:
            await admin.create_topics(
                [NewTopic(n, num_partitions=partitions, replication_factor=1) for n in names]
            )
        finally:
            await admin.close()

    async def produce(
        self,
        topic: str,
        values: list[bytes | str | dict],
        *,
        partition: int | None = None,
        key: bytes | None = None,
        headers: list[tuple[str, bytes]] | None = None,
    ) -> None:
        producer = AIOKafkaProducer(bootstrap_servers=self.bootstrap, acks="all")
        await producer.start()
        try:
            for value in values:
                if isinstance(value, dict):
                    value = json.dumps(value)
                if isinstance(value, str):
                    value = value.encode()
                await producer.send(topic, value=value, key=key, partition=partition, headers=headers)
            await producer.flush()
        finally:
            await producer.stop()

    async def committed(self, group_id: str, topic: str, partitions: int = 1) -> dict[int, int | None]:
        """The group's committed offset per partition, read through a consumer of that group."""
        consumer = AIOKafkaConsumer(
            bootstrap_servers=self.bootstrap, group_id=group_id, enable_auto_commit=False
        )
        await consumer.start()
        try:
            return {p: await consumer.committed(TopicPartition(topic, p)) for p in range(partitions)}
        finally:
            await consumer.stop()

    async def commit(self, group_id: str, topic: str, offsets: dict[int, int], metadata: str = "") -> None:
        """Make ``offsets`` the group's committed offsets (a position another triggerer left)."""
        consumer = AIOKafkaConsumer(
            bootstrap_servers=self.bootstrap, group_id=group_id, enable_auto_commit=False
        )
        await consumer.start()
        try:
            partitions = {TopicPartition(topic, p): (offset, metadata) for p, offset in offsets.items()}
            consumer.assign(list(partitions))
            await consumer.commit(partitions)
        finally:
            await consumer.stop()

    async def delete_groups(self, *group_ids: str) -> None:
        """
        Delete groups without members, offsets and all: what the broker's offset expiry does to
        a group whose offsets are older than ``offsets.retention.minutes``.
        """
        consumer = AIOKafkaConsumer(bootstrap_servers=self.bootstrap, enable_auto_commit=False)
        await consumer.start()
        try:
            client = consumer._client
            for group_id in group_ids:
                node = await client.coordinator_lookup(0, group_id)
                response = await client.send(node, DeleteGroupsRequest([group_id]))
                assert all(error == 0 for _, error in response.results), response
        finally:
            await consumer.stop()

    async def delete_topic(self, topic: str, *, groups: tuple[str, ...]) -> None:
        """
        Delete ``topic`` as Apache Kafka does: with the committed offsets every group had on it.

        Kafka's group coordinator removes a deleted topic's offsets from every group, and a group
        left with no offsets and no members goes with them (KAFKA-2000, ``handleDeletedPartitions``;
        KRaft's ``onPartitionsDeleted``). Tansu does the same; noida-db keeps them (FIDELITY), so
        there ``groups``, each with offsets on ``topic`` alone, are deleted too: the Kafka mode.
        """
        admin = AIOKafkaAdminClient(bootstrap_servers=self.bootstrap)
        await admin.start()
        try:
            await admin.delete_topics([topic])
        finally:
            await admin.close()
        if self.broker.name == "noida-db":
            for group in groups:
                with contextlib.suppress(AssertionError):  # a group that had no offsets yet
                    await self.delete_groups(group)

    async def committed_metadata(self, group_id: str, topic: str) -> str | None:
        """The metadata string the group's offset of partition 0 was committed with."""
        consumer = AIOKafkaConsumer(
            bootstrap_servers=self.bootstrap, group_id=group_id, enable_auto_commit=False
        )
        await consumer.start()
        try:
            tp = TopicPartition(topic, 0)
            offsets = await consumer._coordinator.fetch_committed_offsets([tp])
            found = offsets.get(tp)
            return None if found is None else found.metadata
        finally:
            await consumer.stop()

    async def wait_committed(
        self,
        group_id: str,
        topic: str,
        expected: dict[int, int | None],
        partitions: int = 1,
        timeout: float = 20.0,
    ) -> dict[int, int | None] | None:
        """Poll the group's committed offsets until they equal ``expected``; return the last seen."""
        import asyncio

        deadline = asyncio.get_running_loop().time() + timeout
        seen = None
        while asyncio.get_running_loop().time() < deadline:
            seen = await self.committed(group_id, topic, partitions)
            if seen == expected:
                return seen
            await asyncio.sleep(0.2)
        return seen

    async def read_all(self, topic: str, expected: int, timeout_ms: int = 10_000) -> list:
        """Every record of ``topic`` (group-less), waiting until ``expected`` arrived."""
        consumer = AIOKafkaConsumer(
            topic, bootstrap_servers=self.bootstrap, auto_offset_reset="earliest", enable_auto_commit=False
        )
        await consumer.start()
        records: list = []
        try:
            import time

            deadline = time.monotonic() + timeout_ms / 1000
            while len(records) < expected and time.monotonic() < deadline:
                batch = await consumer.getmany(timeout_ms=500)
                for recs in batch.values():
                    records.extend(recs)
            return records
        finally:
            await consumer.stop()


@pytest.fixture
def kafka(kafka_broker: KafkaBrokerProcess, monkeypatch: pytest.MonkeyPatch) -> KafkaSandbox:
    prefix = f"t{uuid.uuid4().hex[:10]}"
    conn_id = f"kafka_{prefix}"
    extra = {
        "bootstrap.servers": kafka_broker.bootstrap,
        "auto.offset.reset": "earliest",
        "enable.auto.commit": "false",
    }
    monkeypatch.setenv(f"AIRFLOW_CONN_{conn_id.upper()}", json.dumps({"conn_type": "kafka", "extra": extra}))
    return KafkaSandbox(broker=kafka_broker, conn_id=conn_id, prefix=prefix, monkeypatch=monkeypatch)
