"""
One rig per broker for the reliability scenarios, built on the shared contract's broker adapters.

A :class:`BrokerRig` runs the broker (TEST_RIG.md: moto, noida-db/Tansu, the Pub/Sub emulator,
the Service Bus AMQP fake), points a connection of its own at it, and hands the scenarios the
broker's :class:`~tests.integration.contract.broker.ContractBroker` (create a stream, with a
delivery limit of the broker's own whose dead letters go apart from the reject's, publish, count
what is left, take the dead letters, make a trigger): the same adapters the contract suite and the
secret-sentinel test run, so each broker's setup is written once. The broker is started by the
same function in tests/support as the integration suite's session fixture; a rig adds only its
own connection, how the broker is stopped and restarted, and what it cannot do here:

=============  ===================================  ==========================================
broker         outage mid-stream (broker_restart)   SIGKILL of the consumer
=============  ===================================  ==========================================
SQS            stopped 2 s, restarted: moto's       yes
               state lives in its server process
               (tests/support/moto_process.py), its
               HTTP server restarts on its port
Kafka          stopped 2 s, restarted: noida-db     on Tansu: noida-db never evicts a member
               on its port and data dir             killed without leaving (TEST_RIG.md)
Pub/Sub        frozen 15 s (SIGSTOP), resumed       yes
               (SIGCONT): the emulator keeps its
               state in memory only, so a restart
               would lose it; a freeze keeps it
Service Bus    stopped 2 s, restarted: the fake's   yes
               state lives in this process, its
               AMQP listener restarts
=============  ===================================  ==========================================
"""

from __future__ import annotations

import abc
import contextlib
import json
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from tests.integration.contract.broker import ContractBroker

if TYPE_CHECKING:
    from tests.integration.kafka.conftest import KafkaSandbox
    from tests.support.kafka_brokers import KafkaBrokerProcess

REPO = Path(__file__).resolve().parents[2]

BROKERS = ("sqs", "kafka", "pubsub", "servicebus")

DELIVERY_LIMIT = 5
"""The broker's own delivery limit on the leased queues' streams (SQS ``maxReceiveCount``, a Pub/Sub
dead-letter policy's ``max_delivery_attempts``, Service Bus ``MaxDeliveryCount``). Low, so that a
lease lost again and again or a redelivery loop makes the broker dead-letter a message, which the
run counts (it must stay 0); 5 is Pub/Sub's minimum. A fault of the scenarios redelivers a message
at most a few times (one per kill, one for the hung watcher, one for an outage)."""


class BrokerRig(abc.ABC):
    """
    A running broker, its contract adapter, and what the scenarios may do to it: stop and start it
    (the broker is started by the same function in tests/support as the integration suite's).
    """

    name: str
    lease_seconds_min: int
    outage_seconds: float = 2.0
    """How long ``broker_restart`` keeps the broker out (between :meth:`stop_broker` and
    :meth:`start_broker`)."""
    outage_title: str = "broker stopped mid-stream for 2 s, started again"
    """What ``broker_restart`` does to this broker, for the long form's table."""

    delivery_limit: int | None = None
    """The broker-side delivery limit each stream is created with (None: the broker has none)."""

    def __init__(self) -> None:
        self.env = pytest.MonkeyPatch()
        """The connections and emulator host the rig sets, undone when it closes."""
        self.running = contextlib.ExitStack()
        """The broker's process (or server), stopped when the rig closes."""
        self.contract: ContractBroker
        self.conn_id: str

    def connection(self, conn_id: str, connection: dict[str, Any]) -> str:
        """Set connection ``conn_id`` (JSON form) for the rig's life."""
        self.env.setenv(f"AIRFLOW_CONN_{conn_id.upper()}", json.dumps(connection))
        return conn_id

    def trigger_kwargs(self) -> dict[str, Any]:
        """The rig's own connection id, as the trigger's keyword argument."""
        return {self.contract.conn_id_argument: self.conn_id}

    def contract_for(self, *, kills: bool = False, short_lease: bool = False) -> ContractBroker:
        """
        The adapter a scenario runs on: the rig's own, unless the broker needs another for it
        (Kafka: Tansu for kills; a connection with a short ``max.poll.interval.ms``, Kafka's
        lease, for short leases).
        """
        return self.contract

    @abc.abstractmethod
    def stop_broker(self) -> None:
        """Take the broker out mid-stream, keeping its state (queues, messages, leases)."""

    @abc.abstractmethod
    def start_broker(self) -> None:
        """Bring it back on the same address with that state."""

    def close(self) -> None:
        try:
            self.running.close()
        finally:
            self.env.undo()


# -- SQS ---------------------------------------------------------------------------------------


class SqsRig(BrokerRig):
    name = "sqs"
    lease_seconds_min = 2
    delivery_limit = DELIVERY_LIMIT

    def __init__(self) -> None:
        super().__init__()
        from tests.integration.sqs.broker import SqsContractBroker
        from tests.support.brokers import SqsServer, moto_server

        # moto in a process of its own (tests/support/moto_process.py says why); stopped and
        # started again, it keeps its queues, as a restarted endpoint would.
        self.moto = self.running.enter_context(moto_server(own_process=True))
        server = SqsServer(port=self.moto.port, access_key="AKIDRELIABILITY", secret_key="reliability-secret")
        self.conn_id = self.connection("aws_reliability", server.connection())
        self.server = server
        self.contract = SqsContractBroker(server)

    def stop_broker(self) -> None:
        self.moto.stop()

    def start_broker(self) -> None:
        self.moto.start()


# -- Kafka -------------------------------------------------------------------------------------


class KafkaRig(BrokerRig):
    name = "kafka"
    lease_seconds_min = 2  # Kafka has no leases; the contract's shortest "lease" is unused

    def __init__(self) -> None:
        super().__init__()
        from tests.integration.kafka.broker import KafkaContractBroker
        from tests.support.brokers import EventLoopThread
        from tests.support.kafka_brokers import run_kafka_broker

        self._run = run_kafka_broker
        self._dir = Path(tempfile.mkdtemp(prefix="reliability-kafka-"))
        self._clients = EventLoopThread("reliability-kafka-clients")
        self.running.callback(self._clients.close)  # closed after the brokers stop
        self.broker = self._start("noida-db")
        self.contract = KafkaContractBroker(self._sandbox(self.broker, "r"), self._clients)
        self._kill_contract: ContractBroker | None = None
        self._contract_class = KafkaContractBroker

    def _start(self, broker: str) -> KafkaBrokerProcess:
        return self.running.enter_context(self._run(broker, self._dir / broker))

    def _sandbox(self, broker: KafkaBrokerProcess, prefix: str, **settings: str) -> KafkaSandbox:
        """What the adapter needs of a broker (names, bootstrap, connections), with ``settings`` on
        every connection it makes."""
        from tests.integration.kafka.conftest import KafkaSandbox

        prefix = f"{prefix}{uuid.uuid4().hex[:8]}"
        # The adapter makes its own connection (KafkaSandbox.connection), so no conn_id here.
        return KafkaSandbox(broker, conn_id="", prefix=prefix, monkeypatch=self.env, settings=settings)

    def trigger_kwargs(self) -> dict[str, Any]:
        return {}  # the adapter's trigger names its own connection (kafka_config_id)

    def contract_for(self, *, kills: bool = False, short_lease: bool = False) -> ContractBroker:
        if kills:
            # A consumer killed without leaving its group: noida-db never evicts it, Tansu does
            # after the session timeout (TEST_RIG.md), as a Kafka cluster does.
            if self._kill_contract is None:
                session = {"session.timeout.ms": "6000", "heartbeat.interval.ms": "2000"}
                sandbox = self._sandbox(self._start("tansu"), "k", **session)
                self._kill_contract = self._contract_class(sandbox, self._clients)
            return self._kill_contract
        if short_lease:
            # Kafka has no per-message lease; its lease on the partitions is max.poll.interval.ms
            # (a consumer that does not poll for that long leaves its group).
            poll = {"max.poll.interval.ms": str(self.lease_seconds_min * 1000)}
            return self._contract_class(self._sandbox(self.broker, "l", **poll), self._clients)
        return self.contract

    def stop_broker(self) -> None:
        self.broker.stop()

    def start_broker(self) -> None:
        self.broker.start()


# -- Pub/Sub -----------------------------------------------------------------------------------


class PubSubRig(BrokerRig):
    name = "pubsub"
    lease_seconds_min = 10
    delivery_limit = DELIVERY_LIMIT
    outage_seconds = 15.0
    """Longer than a pull's deadline (``PULL_WAIT_SECONDS``, 10 s) and the ack deadline (10 s here):
    the pulls in flight time out and are made again, and the ACKs and lease renewals sent before
    or during the freeze hang past every deadline the emulator tracks. Shorter than those calls'
    own deadline (``rpc_timeout``, 30 s), so they complete on resume; the emulator applies them
    before it expires any ack deadline (checked by hand: a renewal or ACK queued while it was
    frozen wins, a call whose deadline passed meanwhile is dropped and its messages come back),
    so this outage shows little redelivery: in eight short-form runs, once, a poison message whose
    dead-letter copy was on the wire (a lease is not renewed while it is settled) came back and
    was copied twice. 2 s would only have delayed a few calls. An outage past
    ``rpc_timeout`` fails the stream: tests/integration/pubsub covers that with a short
    ``rpc_timeout``, since 35 s here would double the short form's time on Pub/Sub."""
    outage_title = "Pub/Sub emulator frozen mid-stream for 15 s (SIGSTOP), resumed (SIGCONT) with its state"

    def __init__(self) -> None:
        super().__init__()
        from tests.integration.pubsub.broker import PubSubContractBroker
        from tests.support.pubsub_emulator import pubsub_emulator_process

        work_dir = Path(tempfile.mkdtemp(prefix="reliability-pubsub-"))
        emulator = self.running.enter_context(pubsub_emulator_process(work_dir))  # resumes it before stopping
        self.emulator = emulator
        self.env.setenv("PUBSUB_EMULATOR_HOST", emulator.host)
        self.conn_id = self.connection("gcp_reliability", emulator.connection())
        self.contract = PubSubContractBroker(emulator)

    def stop_broker(self) -> None:
        # The emulator keeps topics, subscriptions and messages in memory only: a restarted one
        # is empty. A frozen one keeps them, and to its clients it is a broker that stopped
        # answering mid-call, which is the outage that matters to them.
        self.emulator.freeze()

    def start_broker(self) -> None:
        self.emulator.resume()


# -- Service Bus -------------------------------------------------------------------------------


class ServiceBusRig(BrokerRig):
    name = "servicebus"
    lease_seconds_min = 5
    delivery_limit = DELIVERY_LIMIT

    def __init__(self) -> None:
        super().__init__()
        from tests.integration.servicebus.broker import ServiceBusContractBroker
        from tests.support.servicebus_server import ServiceBusServer

        key_name, key = "RootManageSharedAccessKey", "cmVsaWFiaWxpdHkta2V5LTQ0Mg=="
        self.server = self.running.enter_context(ServiceBusServer(sas_keys={key_name: key}))
        self.conn_id = self.connection(
            "azure_service_bus_reliability", self.server.connection(key_name=key_name, key=key)
        )
        self.contract = ServiceBusContractBroker(self.server)

    def stop_broker(self) -> None:
        self.server.stop()

    def start_broker(self) -> None:
        # Entities, messages and locks live in the server object: a new listener on the same
        # port serves the same state, as a namespace does after a gateway restart.
        self.server.start()


RIGS: dict[str, type[BrokerRig]] = {
    "sqs": SqsRig,
    "kafka": KafkaRig,
    "pubsub": PubSubRig,
    "servicebus": ServiceBusRig,
}


@contextlib.contextmanager
def broker_rig(name: str) -> Iterator[BrokerRig]:
    """Start ``name``'s broker for the block; a broker that cannot start raises (never skips)."""
    try:
        rig = RIGS[name]()
    except Exception as exc:
        raise RuntimeError(f"the {name} broker for the reliability scenarios could not start: {exc}") from exc
    try:
        yield rig
    finally:
        rig.close()
