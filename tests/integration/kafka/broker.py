"""
Kafka's contract adapter (tests/integration/contract/broker.py) on noida-db and Tansu.

The contract is written against synchronous broker helpers; aiokafka is asynchronous, so the
adapter's calls go through tests/support/brokers.py's :class:`KafkaClient`, whose clients run on
an event loop thread of their own.

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

import functools
import json
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import pytest

from airflow_shared_stream.common.matching import RawMessage
from airflow_shared_stream.kafka import KafkaSharedStreamProducer, KafkaSharedStreamTrigger
from airflow_shared_stream.kafka.envelope import KafkaBrokerPayload
from tests.integration.contract.broker import BrokenConnection, ConnectionFailure, ContractBroker
from tests.support.brokers import EventLoopThread, KafkaClient
from tests.support.processes import free_port

SECRET = "Pa55-w0rd-that-must-never-leak"


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


@dataclass
class KafkaStream:
    topic: str
    dead_letter_topic: str | None
    group: str
    published: int = 0
    dead_letters_taken: int = 0


class KafkaContractBroker(ContractBroker):
    broker = "kafka"
    conn_id_argument = "kafka_config_id"
    lease_seconds_min = 2
    reports_broker_lag = True
    redelivers_a_lane_once = False

    def __init__(self, kafka: Any, loop: EventLoopThread) -> None:
        self.kafka = kafka
        self.client = KafkaClient(kafka.bootstrap, loop)
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
        self.client.create_topics([t for t in (topic, dlq) if t])
        return KafkaStream(topic=topic, dead_letter_topic=dlq, group=f"{topic}-g")

    def publish(self, stream: KafkaStream, bodies: list[Any], *, lane: str | None = None) -> list[str]:
        offsets = self.client.produce(stream.topic, [json.dumps(b).encode() for b in bodies], partition=0)
        stream.published += len(bodies)
        return [f"{stream.topic}/0@{offset}" for offset in offsets]

    def message_id(self, payload: dict[str, Any]) -> str:
        return f"{payload['topic']}/{payload['partition']}@{payload['offset']}"

    def remaining(self, stream: KafkaStream) -> int:
        committed = self.client.committed(stream.group, stream.topic)[0]
        return stream.published - (committed or 0)

    def leased(self, stream: KafkaStream) -> int:
        return 0  # Kafka has no leases; the credit-window test counts events instead

    def dead_letters(self, stream: KafkaStream) -> list[Any]:
        assert stream.dead_letter_topic is not None
        records = self.client.read_all(stream.dead_letter_topic)
        fresh = records[stream.dead_letters_taken :]
        stream.dead_letters_taken = len(records)
        return [json.loads(r.value) for r in fresh]

    def break_dead_letter(self, stream: KafkaStream) -> None:
        assert stream.dead_letter_topic is not None
        self.client.delete_topics([stream.dead_letter_topic])

    def trigger(self, stream: KafkaStream, **kwargs: Any) -> KafkaSharedStreamTrigger:
        kwargs.setdefault("dead_letter_topic", stream.dead_letter_topic)
        kwargs.setdefault("kafka_config_id", self.conn_id)
        return ContractKafkaTrigger([stream.topic], group_id=stream.group, **kwargs)

    def metric_prefix(self, stream: KafkaStream) -> str:
        return f"airflow.shared_stream.kafka.{stream.topic}"

    def metric_secrets(self) -> list[str]:
        return [self.kafka.bootstrap]  # metric names carry the topic only

    def other_shape(self, stream: KafkaStream) -> dict[str, Any]:
        return {"dead_letter_topic": self.kafka.name("other-dlq")}

    def _connection(self, request: pytest.FixtureRequest, what: str, **extra: str) -> str:
        """A connection with :data:`SECRET` as its password, ``extra`` as its settings."""
        conn_id = f"kafka_{self.kafka.prefix}_{what}".replace("-", "_")
        connection = {"conn_type": "kafka", "login": "svc", "password": SECRET, "extra": extra}
        self.use_connection(request, conn_id, connection)
        return conn_id

    def missing_upstream(self, request: pytest.FixtureRequest) -> BrokenConnection:
        conn_id = self._connection(request, "missing", **{"bootstrap.servers": self.kafka.bootstrap})
        return BrokenConnection(
            ContractKafkaTrigger([self.kafka.name("nope")], kafka_config_id=conn_id), SECRET
        )

    def refused_credentials(self, request: pytest.FixtureRequest) -> BrokenConnection:
        """
        Neither broker here checks SCRAM credentials; both refuse the mechanism, which takes the
        client's path for refused credentials (the connection fails in authentication).
        """
        settings = {
            "bootstrap.servers": self.kafka.bootstrap,
            "security.protocol": "SASL_PLAINTEXT",
            "sasl.mechanism": "SCRAM-SHA-512",
        }
        conn_id = self._connection(request, "refused", **settings)
        return BrokenConnection(ContractKafkaTrigger([self.kafka.name("t")], kafka_config_id=conn_id), SECRET)

    def unreachable_endpoint(self, request: pytest.FixtureRequest) -> BrokenConnection:
        settings = {
            "bootstrap.servers": f"127.0.0.1:{free_port()}",
            "security.protocol": "SASL_PLAINTEXT",
            "sasl.mechanism": "PLAIN",
        }
        conn_id = self._connection(request, "unreachable", **settings)
        return BrokenConnection(ContractKafkaTrigger(["events"], kafka_config_id=conn_id), SECRET)

    def use_secret_connection(
        self,
        request: pytest.FixtureRequest,
        conn_id: str,
        secret: str,
        failure: ConnectionFailure | None = None,
    ) -> dict[str, Any]:
        """
        The password and SASL/PLAIN's ``sasl.password`` (the brokers here accept any PLAIN
        password); refused: SCRAM, which they refuse, taking the client's bad-credentials path.
        """
        connection = self._secret_connection(secret)
        if failure == "endpoint":
            connection["extra"]["bootstrap.servers"] = f"127.0.0.1:{free_port()}"
        elif failure == "auth":
            connection["extra"]["sasl.mechanism"] = "SCRAM-SHA-512"
        return self.use_connection(request, conn_id, connection)

    def use_misconfigured_connection(
        self, request: pytest.FixtureRequest, conn_id: str, secret: str
    ) -> tuple[dict[str, Any], str]:
        """A SASL mechanism aiokafka cannot do, over TLS."""
        connection = self._secret_connection(secret)
        connection["extra"].update({"security.protocol": "SASL_SSL", "sasl.mechanism": "GSSAPI"})
        return self.use_connection(request, conn_id, connection), "sasl.mechanism"

    def _secret_connection(self, secret: str) -> dict[str, Any]:
        extra = {
            "bootstrap.servers": self.kafka.bootstrap,
            "security.protocol": "SASL_PLAINTEXT",
            "sasl.mechanism": "PLAIN",
            "sasl.username": "svc",
            "sasl.password": secret,
            "auto.offset.reset": "earliest",
            "request.timeout.ms": "12000",
        }
        return {"conn_type": "kafka", "login": "svc", "password": secret, "extra": extra}

    def bad_arguments(self) -> dict[str, Callable[[], object]]:
        trigger = KafkaSharedStreamTrigger
        return {
            "no topics": functools.partial(trigger, []),
            "an empty topic name": functools.partial(trigger, [""]),
        }
