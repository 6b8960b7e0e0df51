"""
Brokers for the e2e suite and the demo: noida-db (Kafka protocol) and moto's SQS server.

Synchronous helpers (each call runs its own short aiokafka/boto3 client), because the e2e tests
and the demo drive a whole deployment from plain, blocking code. Ports are picked at run time;
processes are stopped by PID.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import uuid
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

from tests.support.kafka_brokers import kafka_broker_argv
from tests.support.processes import free_port, running, tail, wait_for_port


@dataclass
class KafkaBroker:
    """A running noida-db broker (Kafka protocol only) on 127.0.0.1."""

    port: int
    log_path: Path

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    def create_topics(self, names: Iterable[str], partitions: int = 1) -> None:
        from aiokafka.admin import AIOKafkaAdminClient, NewTopic

        async def create() -> None:
            admin = AIOKafkaAdminClient(bootstrap_servers=self.bootstrap)
            await admin.start()
            try:
                await admin.create_topics(
                    [NewTopic(n, num_partitions=partitions, replication_factor=1) for n in names]
                )
            finally:
                await admin.close()

        asyncio.run(create())

    def produce(
        self, topic: str, values: Iterable[dict[str, Any]], key_field: str | None = None
    ) -> list[int]:
        """Publish JSON values (acks=all); return their offsets."""
        from aiokafka import AIOKafkaProducer

        async def send() -> list[int]:
            producer = AIOKafkaProducer(bootstrap_servers=self.bootstrap, acks="all")
            await producer.start()
            try:
                offsets = []
                for value in values:
                    key = str(value[key_field]).encode() if key_field and value.get(key_field) else None
                    meta = await producer.send_and_wait(topic, json.dumps(value).encode(), key=key)
                    offsets.append(meta.offset)
                return offsets
            finally:
                await producer.stop()

        return asyncio.run(send())

    def end_offsets(self, topic: str, partitions: int = 1) -> dict[int, int]:
        from aiokafka import AIOKafkaConsumer, TopicPartition

        async def ends() -> dict[int, int]:
            consumer = AIOKafkaConsumer(bootstrap_servers=self.bootstrap)
            await consumer.start()
            try:
                tps = [TopicPartition(topic, p) for p in range(partitions)]
                return {tp.partition: off for tp, off in (await consumer.end_offsets(tps)).items()}
            finally:
                await consumer.stop()

        return asyncio.run(ends())

    def committed(self, group_id: str, topic: str, partitions: int = 1) -> dict[int, int | None]:
        """The group's committed offsets, read with the admin API (joins no group)."""
        from aiokafka import TopicPartition
        from aiokafka.admin import AIOKafkaAdminClient

        async def read() -> dict[int, int | None]:
            admin = AIOKafkaAdminClient(bootstrap_servers=self.bootstrap)
            await admin.start()
            try:
                tps = [TopicPartition(topic, p) for p in range(partitions)]
                offsets = await admin.list_consumer_group_offsets(group_id, partitions=tps)
                found = {tp.partition: meta.offset for tp, meta in offsets.items() if tp.topic == topic}
                return {p: found.get(p) for p in range(partitions)}
            finally:
                await admin.close()

        return asyncio.run(read())

    def read_all(self, topic: str, timeout: float = 5.0) -> list[dict[str, Any]]:
        """Every JSON value on ``topic`` from the beginning (no group, nothing committed)."""
        from aiokafka import AIOKafkaConsumer

        async def read() -> list[dict[str, Any]]:
            consumer = AIOKafkaConsumer(topic, bootstrap_servers=self.bootstrap, auto_offset_reset="earliest")
            await consumer.start()
            try:
                batches = await consumer.getmany(timeout_ms=int(timeout * 1000))
                return [json.loads(m.value) for msgs in batches.values() for m in msgs]
            finally:
                await consumer.stop()

        return asyncio.run(read())


@contextlib.contextmanager
def kafka_broker_process(data_dir: Path) -> Iterator[KafkaBroker]:
    """Run the noida-db binary itself (not its wrapper script: its PID is not the broker's)."""
    port = free_port()
    log_path = data_dir / "noida-db.log"
    argv = kafka_broker_argv("noida-db", port, data_dir / "data")
    with running(argv, log_path=log_path) as proc:
        try:
            wait_for_port(port, 30, proc, what="noida-db")
        except RuntimeError as exc:
            raise RuntimeError(f"{exc}\n{tail(log_path)}") from None
        yield KafkaBroker(port=port, log_path=log_path)


class QueueDepth(NamedTuple):
    """Approximate message counts of a queue: visible, and received but not yet settled."""

    visible: int
    in_flight: int


@dataclass(frozen=True)
class SqsServer:
    """
    moto's SQS HTTP API, served from a thread of this process, with a boto3 client on it.

    Shared by the SQS integration suite, the e2e suite and the demo. Bodies that are not strings
    are sent as JSON.
    """

    port: int
    region: str = "us-east-1"
    access_key: str = "testing"
    secret_key: str = "testing"

    @property
    def endpoint_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def connection(self) -> dict[str, Any]:
        """An ``aws`` connection (JSON form) pointing at this server."""
        return {
            "conn_type": "aws",
            "login": self.access_key,
            "password": self.secret_key,
            "extra": {"region_name": self.region, "endpoint_url": self.endpoint_url},
        }

    @functools.cached_property
    def client(self) -> Any:
        import boto3

        return boto3.client(
            "sqs",
            endpoint_url=self.endpoint_url,
            region_name=self.region,
            aws_access_key_id=self.access_key,
            aws_secret_access_key=self.secret_key,
        )

    def create_queue(
        self,
        name: str | None = None,
        *,
        fifo: bool = False,
        visibility_timeout: int = 20,
        dead_letter_queue_url: str | None = None,
        max_receives: int = 5,
        **attributes: str,
    ) -> str:
        """Create a queue (a fresh unique name by default); a DLQ URL becomes its RedrivePolicy."""
        name = name or f"q-{uuid.uuid4().hex[:12]}" + (".fifo" if fifo else "")
        attrs = {"VisibilityTimeout": str(visibility_timeout), **attributes}
        if fifo:
            attrs["FifoQueue"] = "true"
        if dead_letter_queue_url:
            policy = {
                "deadLetterTargetArn": self.arn(dead_letter_queue_url),
                "maxReceiveCount": str(max_receives),
            }
            attrs["RedrivePolicy"] = json.dumps(policy)
        return self.client.create_queue(QueueName=name, Attributes=attrs)["QueueUrl"]

    def arn(self, queue_url: str) -> str:
        attributes = self.client.get_queue_attributes(QueueUrl=queue_url, AttributeNames=["QueueArn"])
        return attributes["Attributes"]["QueueArn"]

    def send(self, queue_url: str, bodies: Iterable[Any], **extra: Any) -> list[str]:
        """
        Send bodies in batches of 10; return the message ids in order.

        ``extra`` adds entry fields (``MessageAttributes``, ``MessageGroupId``...); a callable
        value is called with the message's index.
        """
        bodies = list(bodies)
        ids: list[str] = []
        for start in range(0, len(bodies), 10):
            entries = []
            for i, body in enumerate(bodies[start : start + 10]):
                entry = {"Id": str(i), "MessageBody": body if isinstance(body, str) else json.dumps(body)}
                entry.update({k: (v(start + i) if callable(v) else v) for k, v in extra.items()})
                entries.append(entry)
            result = self.client.send_message_batch(QueueUrl=queue_url, Entries=entries)
            if result.get("Failed"):
                raise RuntimeError(f"send_message_batch failed: {result['Failed']}")
            by_id = {int(e["Id"]): e["MessageId"] for e in result["Successful"]}
            ids.extend(by_id[i] for i in range(len(entries)))
        return ids

    def depth(self, queue_url: str) -> QueueDepth:
        attrs = self.client.get_queue_attributes(
            QueueUrl=queue_url,
            AttributeNames=["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"],
        )["Attributes"]
        return QueueDepth(
            int(attrs["ApproximateNumberOfMessages"]), int(attrs["ApproximateNumberOfMessagesNotVisible"])
        )

    def drain(self, queue_url: str) -> list[dict[str, Any]]:
        """Receive and delete everything visible; return the raw messages (with attributes)."""
        received: list[dict[str, Any]] = []
        while True:
            messages = self.client.receive_message(
                QueueUrl=queue_url,
                MaxNumberOfMessages=10,
                WaitTimeSeconds=0,
                MessageAttributeNames=["All"],
                MessageSystemAttributeNames=["All"],
            ).get("Messages", [])
            if not messages:
                return received
            received.extend(messages)
            for message in messages:
                self.client.delete_message(QueueUrl=queue_url, ReceiptHandle=message["ReceiptHandle"])


@contextlib.contextmanager
def sqs_server_process(**credentials: str) -> Iterator[SqsServer]:
    """Run moto's SQS server on a free loopback port for the block (any credentials work)."""
    from moto.server import ThreadedMotoServer

    from tests.support.moto_sqs import serialize_queue_mutations

    serialize_queue_mutations()
    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    try:
        wait_for_port(port, 30, what="moto server")
        yield SqsServer(port=port, **credentials)
    finally:
        server.stop()
