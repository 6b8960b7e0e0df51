"""SQS's contract adapter (tests/integration/contract/broker.py) on moto's server."""

from __future__ import annotations

import functools
import json
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest

from airflow_shared_stream.common.metrics import stream_label
from airflow_shared_stream.sqs.trigger import SqsSharedStreamTrigger
from tests.integration.contract.broker import (
    BrokenConnection,
    ConnectionFailure,
    ContractBroker,
    DeadLetters,
)
from tests.support.brokers import SqsServer
from tests.support.processes import free_port


@dataclass
class SqsStream:
    url: str
    dead_letter_url: str | None
    fifo: bool
    over_limit_url: str | None = None
    """Where SQS moves a message past ``maxReceiveCount``, when apart from the reject's queue."""


class SqsContractBroker(ContractBroker):
    broker = "sqs"
    conn_id_argument = "aws_conn_id"
    lease_seconds_min = 2
    reports_broker_lag = True
    gives_back_on_close = True

    def __init__(self, sqs: SqsServer) -> None:
        self.sqs = sqs

    def create_stream(
        self,
        *,
        dead_letter: bool = True,
        lease_seconds: int = 30,
        ordered: bool = False,
        max_deliveries: int | None = None,
    ) -> SqsStream:
        dlq = self.sqs.create_queue(fifo=ordered) if dead_letter or max_deliveries else None
        redrive = {"dead_letter_queue_url": dlq, "max_receives": max_deliveries} if max_deliveries else {}
        url = self.sqs.create_queue(fifo=ordered, visibility_timeout=lease_seconds, **redrive)
        return SqsStream(url=url, dead_letter_url=dlq, fifo=ordered)

    def attempts_spent(self, payload: dict[str, Any]) -> int:
        return int(payload["attributes"]["ApproximateReceiveCount"]) - 1

    def create_limited_stream(self, *, lease_seconds: int, max_deliveries: int) -> SqsStream:
        """The RedrivePolicy targets a queue of its own, not the trigger's dead-letter queue."""
        rejected = self.sqs.create_queue()
        over_limit = self.sqs.create_queue()
        url = self.sqs.create_queue(
            visibility_timeout=lease_seconds, dead_letter_queue_url=over_limit, max_receives=max_deliveries
        )
        return SqsStream(url=url, dead_letter_url=rejected, fifo=False, over_limit_url=over_limit)

    def take_dead_letters(self, stream: SqsStream) -> DeadLetters:
        over_limit = self.sqs.drain(stream.over_limit_url) if stream.over_limit_url else []
        return DeadLetters(self.dead_letters(stream), [json.loads(m["Body"]) for m in over_limit])

    def delivery_limit(self, stream: SqsStream) -> int | None:
        attributes = self.sqs.client.get_queue_attributes(
            QueueUrl=stream.url, AttributeNames=["RedrivePolicy"]
        )
        policy = attributes["Attributes"].get("RedrivePolicy")
        return int(json.loads(policy)["maxReceiveCount"]) if policy else None

    def publish(self, stream: SqsStream, bodies: list[Any], *, lane: str | None = None) -> list[str]:
        extra: dict[str, Any] = {}
        if stream.fifo:
            extra = {
                "MessageGroupId": lane or "default",
                "MessageDeduplicationId": lambda i: uuid.uuid4().hex,
            }
        ids = []
        for body in bodies:  # one at a time: bodies may be large
            ids.extend(self.sqs.send(stream.url, [body], **extra))
        return ids

    def message_id(self, payload: dict[str, Any]) -> str:
        return payload["message_id"]

    def remaining(self, stream: SqsStream) -> int:
        depth = self.sqs.depth(stream.url)
        return depth.visible + depth.in_flight

    def leased(self, stream: SqsStream) -> int:
        return self.sqs.depth(stream.url).in_flight

    def dead_letters(self, stream: SqsStream) -> list[Any]:
        assert stream.dead_letter_url is not None
        return [json.loads(m["Body"]) for m in self.sqs.drain(stream.dead_letter_url)]

    def break_dead_letter(self, stream: SqsStream) -> None:
        assert stream.dead_letter_url is not None
        self.sqs.client.delete_queue(QueueUrl=stream.dead_letter_url)

    def trigger(self, stream: SqsStream, **kwargs: Any) -> SqsSharedStreamTrigger:
        # Short polls on FIFO queues: moto only sees a group unlock when a poll starts.
        kwargs.setdefault("wait_time_seconds", 1 if stream.fifo else 5)
        kwargs.setdefault("dead_letter_queue_url", stream.dead_letter_url)
        return SqsSharedStreamTrigger(stream.url, **kwargs)

    def metric_prefix(self, stream: SqsStream) -> str:
        return f"airflow.shared_stream.sqs.{stream_label(stream.url.rsplit('/', 1)[1])}"

    def metric_secrets(self) -> list[str]:
        return [self.sqs.access_key, self.sqs.secret_key]

    def other_shape(self, stream: SqsStream) -> dict[str, Any]:
        return {"dead_letter_queue_url": self.sqs.create_queue()}

    def missing_upstream(self, request: pytest.FixtureRequest) -> BrokenConnection:
        url = f"{self.sqs.endpoint_url}/123456789012/no-such-queue"
        return BrokenConnection(SqsSharedStreamTrigger(url), self.sqs.secret_key)

    def _connection(self, request: pytest.FixtureRequest, conn_id: str, endpoint_url: str) -> str:
        connection = self.sqs.connection()
        connection["extra"]["endpoint_url"] = endpoint_url
        self.use_connection(request, conn_id, connection)
        return conn_id

    def refused_credentials(self, request: pytest.FixtureRequest) -> BrokenConnection:
        """moto checks credentials only in a server of its own (no IAM user is known there)."""
        endpoint = request.getfixturevalue("authenticating_sqs")
        conn_id = self._connection(request, "aws_refused", endpoint)
        trigger = SqsSharedStreamTrigger(f"{endpoint}/123456789012/orders", aws_conn_id=conn_id)
        return BrokenConnection(trigger, self.sqs.secret_key)

    def unreachable_endpoint(self, request: pytest.FixtureRequest) -> BrokenConnection:
        endpoint = f"http://127.0.0.1:{free_port()}"
        conn_id = self._connection(request, "aws_unreachable", endpoint)
        trigger = SqsSharedStreamTrigger(f"{endpoint}/123456789012/orders", aws_conn_id=conn_id)
        return BrokenConnection(trigger, self.sqs.secret_key)

    def use_secret_connection(
        self,
        request: pytest.FixtureRequest,
        conn_id: str,
        secret: str,
        failure: ConnectionFailure | None = None,
    ) -> dict[str, Any]:
        """The secret access key and the session token; refused by a moto server that checks them."""
        endpoint = self.sqs.endpoint_url
        if failure == "endpoint":
            endpoint = f"http://127.0.0.1:{free_port()}"
        elif failure == "auth":
            endpoint = request.getfixturevalue("authenticating_sqs")
        return self.use_connection(request, conn_id, self._secret_connection(secret, endpoint))

    def use_misconfigured_connection(
        self, request: pytest.FixtureRequest, conn_id: str, secret: str
    ) -> tuple[dict[str, Any], str]:
        """A secret key without its key id."""
        connection = self._secret_connection(secret, self.sqs.endpoint_url)
        del connection["login"]
        return self.use_connection(request, conn_id, connection), "only one of login"

    def _secret_connection(self, secret: str, endpoint_url: str) -> dict[str, Any]:
        return {
            "conn_type": "aws",
            "login": "AKIDSENTINELTEST",
            "password": secret,
            "extra": {
                "region_name": self.sqs.region,
                "endpoint_url": endpoint_url,
                "aws_session_token": secret,
            },
        }

    def bad_arguments(self) -> dict[str, Callable[[], object]]:
        return {
            url: functools.partial(SqsSharedStreamTrigger, url)
            for url in (
                "https://example.com/not/a/queue/at/all",
                "ftp://sqs.us-east-1.amazonaws.com/123456789012/orders",
                "https://sqs.us-east-1.amazonaws.com/orders",
                "not a url",
            )
        }
