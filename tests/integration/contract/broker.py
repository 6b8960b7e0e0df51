"""
What a broker's suite supplies to run the contract: :class:`ContractBroker`, one real upstream per test.

The contract (the other modules of this package) is written once against this adapter; each
broker's ``tests/integration/<broker>/broker.py`` implements it on its real broker, and its
``test_<broker>_contract.py`` subclasses the contract classes that apply (docs/writing-a-broker.rst
lists them). It is each broker's one setup: the reliability rigs (tests/reliability/brokers.py)
and the secret-sentinel test (tests/integration/test_secret_sentinels.py) drive the same adapters.
"""

from __future__ import annotations

import abc
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

import pytest
from airflow.triggers.shared_stream import AdvanceOutcome

from airflow_shared_stream.common.trigger import SharedStreamTrigger
from airflow_shared_stream.testing import Watcher

NOBODY = AdvanceOutcome(acked=0, failed=0, rejected=0)

DELIVERY_LIMIT = 5
"""The brokers' delivery limit in the delivery-budget tests (Pub/Sub's lowest ``max_delivery_attempts``)."""


ConnectionFailure = Literal["endpoint", "auth"]
"""How a connection fails: ``"endpoint"``, nothing listens where it points; ``"auth"``, the
broker (or the identity service in front of it) refuses its credentials."""


@dataclass
class BrokenConnection:
    """A trigger whose stream cannot start, and the credential its failure must never show."""

    trigger: SharedStreamTrigger
    secret: str


@dataclass
class DeadLetters:
    """What one read of a stream's dead-letter destinations took (bodies, in arrival order)."""

    rejected: list[Any]
    """Dead-lettered by the provider's reject (the trigger's dead-letter destination)."""
    over_limit: list[Any]
    """Dead-lettered by the broker itself, past its delivery limit."""


class ContractBroker(abc.ABC):
    """A running broker, as the contract sees it: make streams, publish, read settled state, make triggers."""

    broker: str = ""
    """The trigger's ``broker`` (the metric names' second part: ``shared_stream.<broker>.<stream>``)."""

    lease_seconds_min: int = 2
    """The shortest lease the broker grants (SQS visibility 2 s; Pub/Sub ack deadline 10 s)."""

    reports_broker_lag: bool = False
    """Whether the broker tells how much waits on the upstream (the ``broker_lag`` gauge)."""

    conn_id_argument: str = ""
    """The trigger's keyword for its connection id (``aws_conn_id``, ``kafka_config_id``...)."""

    gives_back_on_close: bool = True
    """Whether a closing stream gives what it still holds back to the broker at once (else the
    leases run out: SQS, whose visibility timeouts are short)."""

    redelivers_a_lane_once: bool = True
    """Whether one redelivery hands an ordered lane out exactly once more (a leased queue gives
    the lane back once); Kafka may hand it out once more again when the retried watcher joins
    behind and seeks its partition back, a duplicate at-least-once allows."""

    give_back_spends_attempt: bool = True
    """Whether giving a held message back to the broker (a stream closing) spends one of its
    delivery attempts: SQS counts every receive and Pub/Sub every redelivery; Service Bus has an
    outcome that does not count (AMQP ``released``)."""

    @abc.abstractmethod
    def create_stream(
        self,
        *,
        dead_letter: bool = True,
        lease_seconds: int = 30,
        ordered: bool = False,
        max_deliveries: int | None = None,
    ) -> Any:
        """
        A fresh upstream (queue / subscription / entity), with a dead-letter destination.

        ``max_deliveries``: the broker's own delivery limit, past which it moves a message to the
        dead-letter destination itself (SQS ``maxReceiveCount``, a Pub/Sub dead-letter policy's
        ``max_delivery_attempts``, Service Bus ``MaxDeliveryCount``); ``None``: the default.
        """

    def create_limited_stream(self, *, lease_seconds: int, max_deliveries: int) -> Any:
        """
        A fresh upstream whose broker-side delivery limit is ``max_deliveries``, dead-lettering past
        it apart from the reject's destination (see :meth:`take_dead_letters`): the reliability
        scenarios count what the broker moved there, which must stay nothing.
        """
        raise NotImplementedError("only brokers with a delivery limit of their own")

    def take_dead_letters(self, stream: Any) -> DeadLetters:
        """Take what reached ``stream``'s dead-letter destinations since the last take, by who moved it."""
        return DeadLetters(rejected=self.dead_letters(stream), over_limit=[])

    def delivery_limit(self, stream: Any) -> int | None:
        """The delivery limit as the broker reports it for ``stream`` (read back, not assumed)."""
        return None

    def attempts_spent(self, payload: dict[str, Any]) -> int:
        """Delivery attempts the broker counted against its limit before this delivery (0: none)."""
        raise NotImplementedError("only brokers that count deliveries run DeliveryBudgetContract")

    @abc.abstractmethod
    def publish(self, stream: Any, bodies: list[Any], *, lane: str | None = None) -> list[str]:
        """Publish JSON bodies (in order, in one lane if given); return their message ids."""

    @abc.abstractmethod
    def message_id(self, payload: dict[str, Any]) -> str:
        """The message id in a trigger event payload (the envelope)."""

    @abc.abstractmethod
    def remaining(self, stream: Any) -> int:
        """Messages still on the upstream, leased or not (not yet acked or dead-lettered)."""

    @abc.abstractmethod
    def leased(self, stream: Any) -> int:
        """Messages currently leased to a consumer (received, not settled, lease not expired)."""

    @abc.abstractmethod
    def dead_letters(self, stream: Any) -> list[Any]:
        """Take the decoded bodies that reached the dead-letter destination so far."""

    @abc.abstractmethod
    def break_dead_letter(self, stream: Any) -> None:
        """Make every dead-letter copy from now on fail (delete the DLQ, revoke the topic...)."""

    @abc.abstractmethod
    def trigger(self, stream: Any, **kwargs: Any) -> SharedStreamTrigger:
        """This broker's trigger on ``stream`` (kwargs: match, reject, max_in_flight...)."""

    # -- what ConnectionContract, TelemetryContract and ShapeConflictContract need ------------

    def metric_prefix(self, stream: Any) -> str:
        """The StatsD name prefix of ``stream``'s metrics (``airflow.shared_stream.<broker>.<label>``)."""
        raise NotImplementedError("only brokers that run TelemetryContract")

    def metric_secrets(self) -> list[str]:
        """Text no metric line may carry (credentials, endpoints with credentials)."""
        return []

    def other_shape(self, stream: Any) -> dict[str, Any]:
        """
        One stream-level trigger kwarg whose value differs from what ``trigger(stream)`` uses (the
        dead-letter destination, where the trigger names one).
        """
        raise NotImplementedError("only brokers that run ShapeConflictContract")

    def missing_upstream(self, request: pytest.FixtureRequest) -> BrokenConnection:
        """A trigger on an upstream that does not exist, through a working connection."""
        raise NotImplementedError("only brokers that run ConnectionContract")

    def refused_credentials(self, request: pytest.FixtureRequest) -> BrokenConnection:
        """A trigger whose connection holds credentials the broker refuses."""
        raise NotImplementedError("only brokers that run ConnectionContract")

    def unreachable_endpoint(self, request: pytest.FixtureRequest) -> BrokenConnection:
        """A trigger whose connection points where nothing answers as the broker."""
        raise NotImplementedError("only brokers that run ConnectionContract")

    def bad_arguments(self) -> dict[str, Callable[[], object]]:
        """Trigger constructions with this broker's own arguments wrong (no I/O needed to tell), by name."""
        raise NotImplementedError("only brokers that run ConnectionContract")

    # -- what the secret-sentinel test needs (tests/integration/test_secret_sentinels.py) ----------

    def use_secret_connection(
        self,
        request: pytest.FixtureRequest,
        conn_id: str,
        secret: str,
        failure: ConnectionFailure | None = None,
    ) -> dict[str, Any]:
        """
        Set connection ``conn_id`` with ``secret`` in every field that holds a credential (for
        the test's duration); return the ``trigger()`` kwargs that use it. ``failure``: the
        connection fails that way instead of working.
        """
        raise NotImplementedError("only brokers that run the secret-sentinel test")

    def use_connection(
        self, request: pytest.FixtureRequest, conn_id: str, connection: dict[str, Any]
    ) -> dict[str, Any]:
        """Set connection ``conn_id`` (JSON form) for the test; return the ``trigger()`` kwargs using it."""
        request.getfixturevalue("monkeypatch").setenv(
            f"AIRFLOW_CONN_{conn_id.upper()}", json.dumps(connection)
        )
        return {self.conn_id_argument: conn_id}

    def use_misconfigured_connection(
        self, request: pytest.FixtureRequest, conn_id: str, secret: str
    ) -> tuple[dict[str, Any], str]:
        """
        Set connection ``conn_id`` with a credential or TLS/SASL option set wrong and ``secret``
        beside it; return the ``trigger()`` kwargs that use it and what its error must name.
        """
        raise NotImplementedError("only brokers that run the secret-sentinel test")


def ids(broker: ContractBroker, watcher: Watcher) -> list[str]:
    return [broker.message_id(p) for p in watcher.payloads]
