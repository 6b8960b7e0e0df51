"""
Pub/Sub's contract adapter (tests/integration/contract/broker.py) on Google's emulator.

Pub/Sub has no API that counts a subscription's unacknowledged or leased messages (the service
reports backlog only through Cloud Monitoring; the emulator not at all, and its snapshots come
back empty). So the settled state the contract reads is what the emulator ACCEPTED: every
``pull``, ``acknowledge`` and ``modify_ack_deadline`` the stream makes goes through
:class:`RecordingClient`, which records a call only after the emulator answered it OK. A message
counts as remaining until an ``acknowledge`` of it succeeded, and as leased from a successful
pull until a successful nack, an acknowledge, or the end of its ack deadline. Dead letters are
read from the emulator itself (a subscription on the dead-letter topic).
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest

from airflow_shared_stream.common.metrics import stream_label
from airflow_shared_stream.pubsub.producer import PubSubSharedStreamProducer
from airflow_shared_stream.pubsub.trigger import PubSubSharedStreamTrigger
from tests.integration.contract.broker import BrokenConnection, ConnectionFailure, ContractBroker, DeadLetters
from tests.integration.pubsub.recording import LEDGERS, Ledger, RecordingTrigger
from tests.support.processes import free_port
from tests.support.pubsub_emulator import PubSubEmulator

SECRET = "pr1vate-key-material-never-logged"


class QuickTimeoutProducer(PubSubSharedStreamProducer):
    """Gives up on an endpoint after 3 s instead of 30 (the connection contract's unreachable endpoint)."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs, rpc_timeout=3.0)


class QuickTimeoutTrigger(PubSubSharedStreamTrigger):
    producer_class = QuickTimeoutProducer


@dataclass
class PubSubStream:
    topic: str
    subscription: str
    dead_letter_topic: str | None
    dead_letter_reader: str | None
    published: list[str] = field(default_factory=list)
    over_limit_reader: str | None = None
    """A subscription on the topic the dead-letter policy forwards to, when apart from the reject's."""


class PubSubContractBroker(ContractBroker):
    broker = "pubsub"
    conn_id_argument = "gcp_conn_id"
    lease_seconds_min = 10  # Pub/Sub's shortest ack deadline

    def __init__(self, pubsub: PubSubEmulator) -> None:
        self.pubsub = pubsub

    def create_stream(
        self,
        *,
        dead_letter: bool = True,
        lease_seconds: int = 30,
        ordered: bool = False,
        max_deliveries: int | None = None,
    ) -> PubSubStream:
        dead_topic = dead_reader = None
        if dead_letter or max_deliveries:
            dead_topic, dead_reader = self.pubsub.topic_with_subscription()
        policy: dict[str, Any] = {}
        if max_deliveries:
            policy = {"dead_letter_topic": dead_topic, "max_delivery_attempts": max_deliveries}
        topic, subscription = self.pubsub.topic_with_subscription(
            ack_deadline_seconds=max(self.lease_seconds_min, lease_seconds), ordering=ordered, **policy
        )
        LEDGERS[subscription] = Ledger(ack_deadline=max(self.lease_seconds_min, lease_seconds))
        return PubSubStream(topic, subscription, dead_topic, dead_reader)

    def create_limited_stream(self, *, lease_seconds: int, max_deliveries: int) -> PubSubStream:
        """The dead-letter policy targets a topic of its own, not the trigger's ``dead_letter_topic``."""
        rejected_topic, rejected_reader = self.pubsub.topic_with_subscription()
        over_limit_topic, over_limit_reader = self.pubsub.topic_with_subscription()
        deadline = max(self.lease_seconds_min, lease_seconds)
        topic, subscription = self.pubsub.topic_with_subscription(
            ack_deadline_seconds=deadline,
            dead_letter_topic=over_limit_topic,
            max_delivery_attempts=max_deliveries,
        )
        LEDGERS[subscription] = Ledger(ack_deadline=deadline)
        stream = PubSubStream(topic, subscription, rejected_topic, rejected_reader)
        stream.over_limit_reader = over_limit_reader
        return stream

    def take_dead_letters(self, stream: PubSubStream) -> DeadLetters:
        over_limit = self.pubsub.pull(stream.over_limit_reader) if stream.over_limit_reader else []
        return DeadLetters(self.dead_letters(stream), [json.loads(m.message.data) for m in over_limit])

    def delivery_limit(self, stream: PubSubStream) -> int | None:
        subscription = self.pubsub.subscriber.get_subscription(subscription=stream.subscription)
        return int(subscription.dead_letter_policy.max_delivery_attempts)

    def publish(self, stream: PubSubStream, bodies: list[Any], *, lane: str | None = None) -> list[str]:
        ids = []
        for body in bodies:
            ids.extend(self.pubsub.publish(stream.topic, [body], ordering_key=lane))
        stream.published.extend(ids)
        return ids

    def message_id(self, payload: dict[str, Any]) -> str:
        return payload["message_id"]

    def attempts_spent(self, payload: dict[str, Any]) -> int:
        # Counted only on a subscription with a dead-letter policy (None without one).
        return (payload["delivery_attempt"] or 1) - 1

    def remaining(self, stream: PubSubStream) -> int:
        acked = LEDGERS[stream.subscription].acked
        return sum(1 for message_id in stream.published if message_id not in acked)

    def leased(self, stream: PubSubStream) -> int:
        return LEDGERS[stream.subscription].leased()

    def dead_letters(self, stream: PubSubStream) -> list[Any]:
        assert stream.dead_letter_reader is not None
        return [json.loads(m.message.data) for m in self.pubsub.pull(stream.dead_letter_reader)]

    def break_dead_letter(self, stream: PubSubStream) -> None:
        assert stream.dead_letter_topic is not None
        self.pubsub.publisher.delete_topic(topic=stream.dead_letter_topic)

    def trigger(self, stream: PubSubStream, **kwargs: Any) -> PubSubSharedStreamTrigger:
        kwargs.setdefault("dead_letter_topic", stream.dead_letter_topic)
        return RecordingTrigger(stream.subscription, **kwargs)

    def metric_prefix(self, stream: PubSubStream) -> str:
        return f"airflow.shared_stream.pubsub.{stream_label(stream.subscription.rsplit('/', 1)[1])}"

    def metric_secrets(self) -> list[str]:
        return [self.pubsub.project]  # metric names carry the subscription id only

    def other_shape(self, stream: PubSubStream) -> dict[str, Any]:
        return {"dead_letter_topic": self.pubsub.create_topic()}

    def _keyed_connection(self, request: pytest.FixtureRequest, emulator_host: str) -> str:
        """``google_cloud_default`` with a key holding :data:`SECRET`, on ``emulator_host``."""
        monkeypatch = request.getfixturevalue("monkeypatch")
        key = {
            "type": "service_account",
            "private_key": SECRET,
            "client_email": "a@b.iam.gserviceaccount.com",
        }
        connection = self.pubsub.connection(keyfile_dict=json.dumps(key))
        self.use_connection(request, "google_cloud_default", connection)
        monkeypatch.setenv("PUBSUB_EMULATOR_HOST", emulator_host)
        return "google_cloud_default"

    def missing_upstream(self, request: pytest.FixtureRequest) -> BrokenConnection:
        self._keyed_connection(request, self.pubsub.host)
        return BrokenConnection(PubSubSharedStreamTrigger("no-such-subscription"), SECRET)

    def refused_credentials(self, request: pytest.FixtureRequest) -> BrokenConnection:
        self._keyed_connection(request, request.getfixturevalue("refusing_pubsub"))
        return BrokenConnection(PubSubSharedStreamTrigger("orders"), SECRET)

    def unreachable_endpoint(self, request: pytest.FixtureRequest) -> BrokenConnection:
        self._keyed_connection(request, f"127.0.0.1:{free_port()}")
        return BrokenConnection(QuickTimeoutTrigger("orders"), SECRET)

    def use_secret_connection(
        self,
        request: pytest.FixtureRequest,
        conn_id: str,
        secret: str,
        failure: ConnectionFailure | None = None,
    ) -> dict[str, Any]:
        """
        A service-account key whose key id and private key hold the secret. The emulator takes no
        credentials: the key is used (and refused, at a token endpoint where nothing listens) only
        against "Google", without ``PUBSUB_EMULATOR_HOST``.
        """
        key = {
            "type": "service_account",
            "project_id": self.pubsub.project,
            "private_key_id": secret,
            "private_key": f"-----BEGIN PRIVATE KEY-----\n{secret}\n-----END PRIVATE KEY-----\n",
            "client_email": "sentinel@example.iam.gserviceaccount.com",
            "token_uri": f"http://127.0.0.1:{free_port()}/token",
        }
        monkeypatch = request.getfixturevalue("monkeypatch")
        if failure == "endpoint":
            monkeypatch.setenv("PUBSUB_EMULATOR_HOST", f"127.0.0.1:{free_port()}")
        elif failure == "auth":
            monkeypatch.delenv("PUBSUB_EMULATOR_HOST")
        return self.use_connection(request, conn_id, self._keyed(json.dumps(key)))

    def use_misconfigured_connection(
        self, request: pytest.FixtureRequest, conn_id: str, secret: str
    ) -> tuple[dict[str, Any], str]:
        """A key that is not a service-account JSON object (away from the emulator, which takes no key)."""
        request.getfixturevalue("monkeypatch").delenv("PUBSUB_EMULATOR_HOST")
        return self.use_connection(request, conn_id, self._keyed("{" + secret)), "not a JSON object"

    def _keyed(self, keyfile_dict: str) -> dict[str, Any]:
        extra = {"project": self.pubsub.project, "keyfile_dict": keyfile_dict}
        return {"conn_type": "google_cloud_platform", "extra": extra}

    def bad_arguments(self) -> dict[str, Callable[[], object]]:
        trigger = PubSubSharedStreamTrigger
        return {
            "empty subscription": functools.partial(trigger, ""),
            "not a subscription path": functools.partial(trigger, "a/b/c"),
            "a topic path": functools.partial(trigger, "projects/p/topics/t"),
            "no connection id": functools.partial(trigger, "orders", gcp_conn_id=""),
        }
