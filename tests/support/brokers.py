"""
Brokers for the suites, the reliability rigs and the demo: noida-db (Kafka protocol) and moto's
SQS server.

Synchronous helpers (each call runs its own short aiokafka/boto3 client), because the e2e tests
and the demo drive a whole deployment from plain, blocking code, and the contract's adapters are
written against synchronous calls (:class:`KafkaClient` runs its clients on an event loop thread
of its own, so it also works inside a running loop). Ports are picked at run time; processes
are stopped by PID.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
import json
import os
import subprocess
import sys
import threading
import uuid
from collections.abc import Awaitable, Callable, Coroutine, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple, TypeVar

from tests.support.kafka_brokers import run_kafka_broker
from tests.support.processes import free_port, stop, wait_for_port

T = TypeVar("T")
REPO = Path(__file__).resolve().parents[2]


class EventLoopThread:
    """
    An event loop in a thread of its own, for synchronous broker helpers.

    The helpers are called from plain code (the e2e suite, the demo) and from inside a running
    event loop (the contract's adapters, called by async tests), where ``asyncio.run`` cannot.
    """

    def __init__(self, name: str = "broker-clients") -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name=name, daemon=True)
        self.thread.start()

    def run(self, coro: Coroutine[Any, Any, T], timeout: float = 60) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


class KafkaClient:
    """Synchronous aiokafka helpers on one Kafka-protocol broker: each call runs a short client."""

    def __init__(self, bootstrap: str, loop: EventLoopThread | None = None) -> None:
        self.bootstrap = bootstrap
        self._own_loop = loop is None
        self.loop = loop or EventLoopThread("kafka-clients")

    def close(self) -> None:
        if self._own_loop:
            self.loop.close()

    def create_topics(self, names: Iterable[str], partitions: int = 1) -> None:
        from aiokafka.admin import NewTopic

        topics = [NewTopic(n, num_partitions=partitions, replication_factor=1) for n in names]
        self.loop.run(self._admin(lambda admin: admin.create_topics(topics)))

    def delete_topics(self, names: Iterable[str]) -> None:
        self.loop.run(self._admin(lambda admin: admin.delete_topics(list(names))))

    async def _admin(self, call: Callable[[Any], Awaitable[Any]]) -> Any:
        from aiokafka.admin import AIOKafkaAdminClient

        admin = AIOKafkaAdminClient(bootstrap_servers=self.bootstrap)
        await admin.start()
        try:
            return await call(admin)
        finally:
            await admin.close()

    def produce(
        self,
        topic: str,
        values: Iterable[bytes],
        *,
        keys: Iterable[bytes | None] = (),
        partition: int | None = None,
    ) -> list[int]:
        """Publish ``values`` in order (acks=all, one at a time); return their offsets."""
        return self.loop.run(self._produce(topic, list(values), list(keys), partition))

    async def _produce(
        self, topic: str, values: list[bytes], keys: list[bytes | None], partition: int | None
    ) -> list[int]:
        from aiokafka import AIOKafkaProducer

        producer = AIOKafkaProducer(bootstrap_servers=self.bootstrap, acks="all", max_request_size=2**21)
        await producer.start()
        try:
            offsets = []
            for value, key in itertools.zip_longest(values, keys[: len(values)]):
                meta = await producer.send_and_wait(topic, value, key=key, partition=partition)
                offsets.append(meta.offset)
            return offsets
        finally:
            await producer.stop()

    def committed(self, group_id: str, topic: str, partitions: int = 1) -> dict[int, int | None]:
        """The group's committed offset per partition, read by a consumer that joins no group."""
        return self.loop.run(self._committed(group_id, topic, partitions))

    async def _committed(self, group_id: str, topic: str, partitions: int) -> dict[int, int | None]:
        from aiokafka import AIOKafkaConsumer, TopicPartition

        consumer = AIOKafkaConsumer(
            bootstrap_servers=self.bootstrap, group_id=group_id, enable_auto_commit=False
        )
        await consumer.start()
        try:
            return {p: await consumer.committed(TopicPartition(topic, p)) for p in range(partitions)}
        finally:
            await consumer.stop()

    def end_offsets(self, topic: str, partitions: int = 1) -> dict[int, int]:
        return self.loop.run(self._end_offsets(topic, partitions))

    async def _end_offsets(self, topic: str, partitions: int) -> dict[int, int]:
        from aiokafka import AIOKafkaConsumer, TopicPartition

        consumer = AIOKafkaConsumer(bootstrap_servers=self.bootstrap)
        await consumer.start()
        try:
            tps = [TopicPartition(topic, p) for p in range(partitions)]
            return {tp.partition: off for tp, off in (await consumer.end_offsets(tps)).items()}
        finally:
            await consumer.stop()

    def read_all(self, topic: str, first_wait: float = 1.0, quiet: float = 1.0) -> list[Any]:
        """
        Every record of ``topic`` from the beginning (no group): waits up to ``first_wait`` s for
        the first, then reads until ``quiet`` s bring none.
        """
        return self.loop.run(self._read_all(topic, first_wait, quiet))

    async def _read_all(self, topic: str, first_wait: float, quiet: float) -> list[Any]:
        from aiokafka import AIOKafkaConsumer

        consumer = AIOKafkaConsumer(
            topic, bootstrap_servers=self.bootstrap, auto_offset_reset="earliest", enable_auto_commit=False
        )
        await consumer.start()
        records: list[Any] = []
        try:
            wait = first_wait
            while batch := await consumer.getmany(timeout_ms=int(wait * 1000)):
                for received in batch.values():
                    records.extend(received)
                wait = quiet
            return records
        finally:
            await consumer.stop()


@dataclass
class KafkaBroker:
    """A running noida-db broker (Kafka protocol only) on 127.0.0.1, with synchronous helpers."""

    port: int
    log_path: Path

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    @functools.cached_property
    def client(self) -> KafkaClient:
        return KafkaClient(self.bootstrap)

    def create_topics(self, names: Iterable[str], partitions: int = 1) -> None:
        self.client.create_topics(names, partitions)

    def produce(
        self, topic: str, values: Iterable[dict[str, Any]], key_field: str | None = None
    ) -> list[int]:
        """Publish JSON values (acks=all); return their offsets."""
        values = list(values)
        keys = [str(v[key_field]).encode() if key_field and v.get(key_field) else None for v in values]
        return self.client.produce(topic, [json.dumps(v).encode() for v in values], keys=keys)

    def end_offsets(self, topic: str, partitions: int = 1) -> dict[int, int]:
        return self.client.end_offsets(topic, partitions)

    def committed(self, group_id: str, topic: str, partitions: int = 1) -> dict[int, int | None]:
        """The group's committed offsets (read without joining the group)."""
        return self.client.committed(group_id, topic, partitions)

    def read_all(self, topic: str, timeout: float = 5.0) -> list[dict[str, Any]]:
        """Every JSON value on ``topic`` from the beginning (no group, nothing committed)."""
        return [json.loads(r.value) for r in self.client.read_all(topic, first_wait=timeout)]


@contextlib.contextmanager
def kafka_broker_process(data_dir: Path, name: str = "noida-db") -> Iterator[KafkaBroker]:
    """Run ``name`` for the block (:func:`~tests.support.kafka_brokers.run_kafka_broker`), with helpers."""
    with run_kafka_broker(name, data_dir) as broker:
        yield KafkaBroker(port=broker.port, log_path=broker.log_path)


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


def start_threaded_moto(server: Any, port: int) -> None:
    """
    ``ThreadedMotoServer.start()``, except that a server whose thread cannot bind the port (another
    process took it after ``free_port()``) raises instead of leaving ``start()`` waiting forever.
    """
    server._thread = threading.Thread(target=server._server_entry, daemon=True)
    server._thread.start()
    while not server._server_ready_event.wait(0.1):
        if not server._thread.is_alive():
            raise RuntimeError(f"moto could not listen on 127.0.0.1:{port} (its thread's error is above)")


class MotoServer:
    """
    moto's server (its SQS guarded by :func:`~tests.support.moto_sqs.serialize_queue_mutations`, and
    writing SQS's ``DeadLetterQueueSourceArn``: tests/support/moto_dead_letter_source.py) on
    127.0.0.1, which can be stopped and started again on its port with its queues and messages, as
    a restarted SQS endpoint comes back.

    In a thread of this process by default (a test may read moto's backends: what its STS handed
    out); with ``own_process``, in a process of its own, driven over stdin
    (tests/support/moto_process.py says why the reliability runs need that).
    """

    def __init__(self, port: int | None = None, *, own_process: bool = False) -> None:
        self.port = port or free_port()
        self.own_process = own_process
        self._threaded: Any = None
        self._child: subprocess.Popen[str] | None = None

    def start(self) -> None:
        """Serve on the port (again, after :meth:`stop`, with the state moto kept)."""
        if not self.own_process:
            if self._threaded is not None:
                return
            from moto.server import ThreadedMotoServer

            from tests.support.moto_dead_letter_source import record_dead_letter_source
            from tests.support.moto_sqs import serialize_queue_mutations

            serialize_queue_mutations()
            record_dead_letter_source()
            self._threaded = ThreadedMotoServer(ip_address="127.0.0.1", port=self.port, verbose=False)
            start_threaded_moto(self._threaded, self.port)
        elif self._child is None:
            self._child = subprocess.Popen(
                [sys.executable, "-m", "tests.support.moto_process", str(self.port)],
                cwd=REPO,
                env={**os.environ, "PYTHONPATH": str(REPO)},
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
                start_new_session=True,
            )
            self._expect("ready")
        else:
            self._command("start")
        # A threaded moto listens in this process, an own_process one in its child: ours either way.
        owner = self._child.pid if self._child is not None else os.getpid()
        wait_for_port(self.port, 30, self._child, what="moto server", owner=owner)

    def stop(self) -> None:
        """Stop serving; moto keeps its state for :meth:`start`."""
        if self._child is not None:
            self._command("stop")
        elif self._threaded is not None:
            self._threaded.stop()
            self._threaded = None

    def close(self) -> None:
        """Stop serving for good (and end the process of its own)."""
        if self._child is None:
            self.stop()
            return
        child, self._child = self._child, None
        if child.stdin is not None:
            child.stdin.close()  # end of input: the server stops and the process exits
        try:
            child.wait(10)
        except subprocess.TimeoutExpired:
            stop(child)

    def _command(self, command: str) -> None:
        assert self._child is not None
        assert self._child.stdin is not None
        self._child.stdin.write(command + "\n")
        self._child.stdin.flush()
        self._expect("ok")

    def _expect(self, answer: str) -> None:
        assert self._child is not None
        assert self._child.stdout is not None
        line = self._child.stdout.readline().strip()
        if line != answer:
            exit_code = self._child.poll()
            raise RuntimeError(f"moto server process answered {line!r}, not {answer!r} (exit {exit_code})")


@contextlib.contextmanager
def moto_server(*, own_process: bool = False) -> Iterator[MotoServer]:
    """Run :class:`MotoServer` for the block: the one way the suites and the rigs start moto."""
    server = MotoServer(own_process=own_process)
    try:
        server.start()
        yield server
    finally:
        server.close()


@contextlib.contextmanager
def sqs_server_process(**credentials: str) -> Iterator[SqsServer]:
    """Run moto's SQS server on a free loopback port for the block (any credentials work)."""
    with moto_server() as server:
        yield SqsServer(port=server.port, **credentials)
