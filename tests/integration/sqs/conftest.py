"""A real SQS API on loopback: moto's HTTP server, started once per test session."""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from typing import Any

import boto3
import pytest
from moto.server import ThreadedMotoServer

from tests.support.processes import free_port, wait_for_port

REGION = "us-east-1"
ACCESS_KEY = "AKIDSHAREDSTREAMTEST"
SECRET_KEY = "s3cr3t-never-in-logs-8d1f2"


@pytest.fixture(scope="session")
def sqs_endpoint() -> Iterator[str]:
    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    try:
        wait_for_port(port, timeout=30, what="moto SQS server")
    except RuntimeError as exc:
        raise RuntimeError(f"the SQS test broker (moto) could not start: {exc}") from exc
    yield f"http://127.0.0.1:{port}"
    server.stop()


@pytest.fixture
def aws_connection(sqs_endpoint: str, monkeypatch: pytest.MonkeyPatch) -> str:
    """``aws_default`` pointing at moto, in the Amazon provider's connection format."""
    conn = {
        "conn_type": "aws",
        "login": ACCESS_KEY,
        "password": SECRET_KEY,
        "extra": {"region_name": REGION, "endpoint_url": sqs_endpoint},
    }
    monkeypatch.setenv("AIRFLOW_CONN_AWS_DEFAULT", json.dumps(conn))
    return "aws_default"


@dataclass
class Sqs:
    """A synchronous boto3 client on the test broker, for arranging and inspecting queues."""

    client: Any

    def create_queue(self, *, fifo: bool = False, visibility_timeout: int = 30, **attributes: str) -> str:
        name = f"q-{uuid.uuid4().hex[:12]}" + (".fifo" if fifo else "")
        attrs = {"VisibilityTimeout": str(visibility_timeout), **attributes}
        if fifo:
            attrs["FifoQueue"] = "true"
        return self.client.create_queue(QueueName=name, Attributes=attrs)["QueueUrl"]

    def arn(self, queue_url: str) -> str:
        attributes = self.client.get_queue_attributes(QueueUrl=queue_url, AttributeNames=["QueueArn"])
        return attributes["Attributes"]["QueueArn"]

    def send(self, queue_url: str, bodies: list[Any], **extra: Any) -> list[str]:
        """Send bodies (dicts are JSON-encoded) in batches of 10; return the message ids in order."""
        ids: list[str] = []
        for start in range(0, len(bodies), 10):
            entries = []
            for i, body in enumerate(bodies[start : start + 10]):
                entry = {"Id": str(i), "MessageBody": body if isinstance(body, str) else json.dumps(body)}
                entry.update({k: (v(start + i) if callable(v) else v) for k, v in extra.items()})
                entries.append(entry)
            response = self.client.send_message_batch(QueueUrl=queue_url, Entries=entries)
            assert not response.get("Failed"), response["Failed"]
            by_id = {int(r["Id"]): r["MessageId"] for r in response["Successful"]}
            ids.extend(by_id[i] for i in range(len(entries)))
        return ids

    def depth(self, queue_url: str) -> tuple[int, int]:
        """(visible, in flight) message counts."""
        attrs = self.client.get_queue_attributes(
            QueueUrl=queue_url,
            AttributeNames=["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"],
        )["Attributes"]
        return int(attrs["ApproximateNumberOfMessages"]), int(attrs["ApproximateNumberOfMessagesNotVisible"])

    def drain(self, queue_url: str) -> list[dict[str, Any]]:
        """Receive (and delete) everything visible on a queue."""
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
            for m in messages:
                self.client.delete_message(QueueUrl=queue_url, ReceiptHandle=m["ReceiptHandle"])


@pytest.fixture
def sqs(sqs_endpoint: str) -> Sqs:
    client = boto3.client(
        "sqs",
        region_name=REGION,
        endpoint_url=sqs_endpoint,
        aws_access_key_id=ACCESS_KEY,
        aws_secret_access_key=SECRET_KEY,
    )
    return Sqs(client)


@pytest.fixture
async def harness() -> AsyncIterator[Any]:
    from airflow_shared_stream.testing import SharedStreamHarness

    async with SharedStreamHarness(confirm_after=0.0) as h:
        yield h
