"""
Brokers for the e2e suite and the demo: noida-db (Kafka protocol) and moto's SQS server.

Synchronous helpers (each call runs its own short aiokafka/boto3 client), because the e2e tests
and the demo drive a whole deployment from plain, blocking code. Ports are picked at run time;
processes are stopped by PID.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sysconfig
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.support.processes import free_port, running, tail, wait_for_port

SITE = Path(sysconfig.get_paths()["purelib"])
NOIDA_DB = SITE / "noida_db" / "noida-db"


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
    argv = [str(NOIDA_DB), "start", "--data-dir", str(data_dir / "data"), "--host", "127.0.0.1",
            "--only", "kafka", "--kafka-port", str(port)]  # fmt: skip
    with running(argv, log_path=log_path) as proc:
        try:
            wait_for_port(port, 30, proc, what="noida-db")
        except RuntimeError as exc:
            raise RuntimeError(f"{exc}\n{tail(log_path)}") from None
        yield KafkaBroker(port=port, log_path=log_path)


@dataclass
class SqsServer:
    """moto's SQS HTTP API, served from a thread of this process."""

    port: int
    region: str = "us-east-1"

    @property
    def endpoint_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def connection(self) -> dict[str, Any]:
        """The ``aws_default`` connection (JSON form) pointing at this server, with dummy keys."""
        return {
            "conn_type": "aws",
            "login": "testing",
            "password": "testing",
            "extra": {"region_name": self.region, "endpoint_url": self.endpoint_url},
        }

    def client(self) -> Any:
        import boto3

        return boto3.client(
            "sqs",
            endpoint_url=self.endpoint_url,
            region_name=self.region,
            aws_access_key_id="testing",
            aws_secret_access_key="testing",
        )

    def create_queue(
        self,
        name: str,
        dead_letter_queue_url: str | None = None,
        max_receives: int = 5,
        visibility_timeout: int = 20,
    ) -> str:
        sqs = self.client()
        attributes = {"VisibilityTimeout": str(visibility_timeout)}
        if dead_letter_queue_url:
            arn = sqs.get_queue_attributes(QueueUrl=dead_letter_queue_url, AttributeNames=["QueueArn"])
            attributes["RedrivePolicy"] = json.dumps(
                {"deadLetterTargetArn": arn["Attributes"]["QueueArn"], "maxReceiveCount": str(max_receives)}
            )
        return sqs.create_queue(QueueName=name, Attributes=attributes)["QueueUrl"]

    def send(self, queue_url: str, values: Iterable[dict[str, Any]]) -> list[str]:
        """Send JSON bodies in batches of 10; return the message ids in order."""
        sqs = self.client()
        values = list(values)
        ids: list[str] = []
        for start in range(0, len(values), 10):
            chunk = values[start : start + 10]
            entries = [{"Id": str(i), "MessageBody": json.dumps(v)} for i, v in enumerate(chunk)]
            result = sqs.send_message_batch(QueueUrl=queue_url, Entries=entries)
            if result.get("Failed"):
                raise RuntimeError(f"send_message_batch failed: {result['Failed']}")
            by_id = {int(e["Id"]): e["MessageId"] for e in result["Successful"]}
            ids.extend(by_id[i] for i in range(len(chunk)))
        return ids

    def depth(self, queue_url: str) -> dict[str, int]:
        """Visible, in-flight and delayed message counts."""
        attrs = self.client().get_queue_attributes(
            QueueUrl=queue_url,
            AttributeNames=[
                "ApproximateNumberOfMessages",
                "ApproximateNumberOfMessagesNotVisible",
                "ApproximateNumberOfMessagesDelayed",
            ],
        )["Attributes"]
        return {k.removeprefix("ApproximateNumberOf"): int(v) for k, v in attrs.items()}

    def drain(self, queue_url: str) -> list[dict[str, Any]]:
        """Receive and delete everything visible (JSON bodies), e.g. to inspect a dead-letter queue."""
        sqs = self.client()
        bodies: list[dict[str, Any]] = []
        while True:
            got = sqs.receive_message(QueueUrl=queue_url, MaxNumberOfMessages=10, WaitTimeSeconds=1)
            messages = got.get("Messages", [])
            if not messages:
                return bodies
            for message in messages:
                bodies.append(json.loads(message["Body"]))
                sqs.delete_message(QueueUrl=queue_url, ReceiptHandle=message["ReceiptHandle"])


@contextlib.contextmanager
def sqs_server_process() -> Iterator[SqsServer]:
    """Run moto's SQS server on a free loopback port for the block."""
    from moto.server import ThreadedMotoServer

    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    try:
        wait_for_port(port, 30, what="moto server")
        yield SqsServer(port=port)
    finally:
        server.stop()
