"""
One rig per broker for the reliability scenarios, built on the shared contract's broker adapters.

A :class:`BrokerRig` runs the broker (TEST_RIG.md: moto, noida-db/Tansu, the Pub/Sub emulator,
the Service Bus AMQP fake), points a connection of its own at it, and hands the scenarios the
broker's :class:`~tests.integration.contract.broker.ContractBroker` (create a stream, with a
delivery limit of the broker's own whose dead letters go apart from the reject's, publish, count
what is left, take the dead letters, make a trigger): the same adapters the contract suite and the
secret-sentinel test run, so each broker's setup is written once. A rig adds only how the broker
is started, stopped and restarted, and what it cannot do here:

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
import os
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.integration.contract.broker import ContractBroker
from tests.support.processes import free_port, running, stop, tail, wait_for_port

REPO = Path(__file__).resolve().parents[2]

BROKERS = ("sqs", "kafka", "pubsub", "servicebus")

DELIVERY_LIMIT = 5
"""The broker's own delivery limit on the leased queues' streams (SQS ``maxReceiveCount``, a Pub/Sub
dead-letter policy's ``max_delivery_attempts``, Service Bus ``MaxDeliveryCount``). Low, so that a
lease lost again and again or a redelivery loop makes the broker dead-letter a message, which the
run counts (it must stay 0); 5 is Pub/Sub's minimum. A fault of the scenarios redelivers a message
at most a few times (one per kill, one for the hung watcher, one for an outage)."""


class _Environment:
    """Environment variables a rig sets (connections, emulator host), restored when it closes."""

    def __init__(self) -> None:
        self._saved: dict[str, str | None] = {}

    def set(self, name: str, value: str) -> None:
        self._saved.setdefault(name, os.environ.get(name))
        os.environ[name] = value

    def connection(self, conn_id: str, connection: dict[str, Any]) -> str:
        self.set(f"AIRFLOW_CONN_{conn_id.upper()}", json.dumps(connection))
        return conn_id

    def restore(self) -> None:
        for name, value in self._saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        self._saved.clear()


class BrokerRig(abc.ABC):
    """A running broker, its contract adapter, and what the scenarios may do to it."""

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
        self.env = _Environment()
        self.contract: ContractBroker
        self.conn_id: str

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
        self.env.restore()


# -- SQS ---------------------------------------------------------------------------------------


class SqsRig(BrokerRig):
    name = "sqs"
    lease_seconds_min = 2
    delivery_limit = DELIVERY_LIMIT

    def __init__(self) -> None:
        super().__init__()
        from tests.integration.sqs.broker import SqsContractBroker
        from tests.support.brokers import SqsServer

        self.port = free_port()
        # moto in a process of its own (tests/support/moto_process.py says why): it answers
        # "stop" and "start" on stdin, keeping its queues, as a restarted endpoint would.
        self._server = subprocess.Popen(
            [sys.executable, "-m", "tests.support.moto_process", str(self.port)],
            cwd=REPO,
            env={**os.environ, "PYTHONPATH": str(REPO)},
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        self._expect("ready")
        wait_for_port(self.port, 30, self._server, what="moto server")
        server = SqsServer(port=self.port, access_key="AKIDRELIABILITY", secret_key="reliability-secret")
        self.conn_id = self.env.connection("aws_reliability", server.connection())
        self.server = server
        self.contract = SqsContractBroker(server)

    def _command(self, command: str) -> None:
        assert self._server.stdin is not None
        self._server.stdin.write(command + "\n")
        self._server.stdin.flush()
        self._expect("ok")

    def _expect(self, answer: str) -> None:
        assert self._server.stdout is not None
        line = self._server.stdout.readline().strip()
        if line != answer:
            exit_code = self._server.poll()
            raise RuntimeError(f"moto server process answered {line!r}, not {answer!r} (exit {exit_code})")

    def stop_broker(self) -> None:
        self._command("stop")

    def start_broker(self) -> None:
        self._command("start")
        wait_for_port(self.port, 30, self._server, what="moto server")

    def close(self) -> None:
        if self._server.stdin is not None:
            self._server.stdin.close()  # end of input: the server stops and the process exits
        try:
            self._server.wait(10)
        except subprocess.TimeoutExpired:
            stop(self._server)
        super().close()


# -- Kafka -------------------------------------------------------------------------------------


@dataclass
class _KafkaTarget:
    """What the Kafka contract adapter needs of a broker: names, bootstrap, connections."""

    broker_name: str
    port: int
    env: _Environment
    prefix: str
    session_timeout_ms: int | None = None
    extra: dict[str, str] | None = None

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    def name(self, what: str) -> str:
        return f"{self.prefix}-{what}"

    def connection(self, what: str = "conn", **extra: str) -> str:
        settings = {"bootstrap.servers": self.bootstrap, "enable.auto.commit": "false", **extra}
        settings.update(self.extra or {})
        if self.session_timeout_ms is not None:
            settings["session.timeout.ms"] = str(self.session_timeout_ms)
            settings["heartbeat.interval.ms"] = str(self.session_timeout_ms // 3)
        conn_id = f"kafka_{self.prefix}_{what}".replace("-", "_")
        return self.env.connection(conn_id, {"conn_type": "kafka", "extra": settings})


class KafkaRig(BrokerRig):
    name = "kafka"
    lease_seconds_min = 2  # Kafka has no leases; the contract's shortest "lease" is unused

    def __init__(self) -> None:
        super().__init__()
        from tests.integration.kafka.broker import KafkaContractBroker
        from tests.support.brokers import EventLoopThread
        from tests.support.kafka_brokers import kafka_broker_argv

        self._argv = kafka_broker_argv
        self._clients = EventLoopThread("reliability-kafka-clients")
        self._dir = Path(tempfile.mkdtemp(prefix="reliability-kafka-"))
        self._procs: dict[str, Any] = {}
        self._ports: dict[str, int] = {}
        self._start("noida-db")
        prefix = f"r{uuid.uuid4().hex[:8]}"
        self.contract = KafkaContractBroker(
            _KafkaTarget("noida-db", self._ports["noida-db"], self.env, prefix), self._clients
        )
        self._kill_contract: ContractBroker | None = None
        self._contract_class = KafkaContractBroker

    def _start(self, broker: str) -> None:
        port = self._ports.setdefault(broker, free_port())
        log_path = self._dir / f"{broker}.log"
        context = running(self._argv(broker, port, self._dir / broker), log_path=log_path)
        proc = context.__enter__()
        self._procs[broker] = (context, proc)
        try:
            wait_for_port(port, 30, proc, what=broker)
        except RuntimeError as exc:
            raise RuntimeError(f"{exc}\n{tail(log_path)}") from None

    def _stop(self, broker: str) -> None:
        context, proc = self._procs.pop(broker)
        stop(proc)
        context.__exit__(None, None, None)

    def trigger_kwargs(self) -> dict[str, Any]:
        return {}  # the adapter's trigger names its own connection (kafka_config_id)

    def contract_for(self, *, kills: bool = False, short_lease: bool = False) -> ContractBroker:
        if kills:
            # A consumer killed without leaving its group: noida-db never evicts it, Tansu does
            # after the session timeout (TEST_RIG.md), as a Kafka cluster does.
            if self._kill_contract is None:
                self._start("tansu")
                target = _KafkaTarget(
                    "tansu",
                    self._ports["tansu"],
                    self.env,
                    f"k{uuid.uuid4().hex[:8]}",
                    session_timeout_ms=6000,
                )
                self._kill_contract = self._contract_class(target, self._clients)
            return self._kill_contract
        if short_lease:
            # Kafka has no per-message lease; its lease on the partitions is max.poll.interval.ms
            # (a consumer that does not poll for that long leaves its group).
            target = _KafkaTarget(
                "noida-db",
                self._ports["noida-db"],
                self.env,
                f"l{uuid.uuid4().hex[:8]}",
                extra={"max.poll.interval.ms": str(self.lease_seconds_min * 1000)},
            )
            return self._contract_class(target, self._clients)
        return self.contract

    def stop_broker(self) -> None:
        self._stop("noida-db")

    def start_broker(self) -> None:
        self._start("noida-db")

    def close(self) -> None:
        for broker in list(self._procs):
            self._stop(broker)
        self._clients.close()
        super().close()


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

        self._context = pubsub_emulator_process(Path(tempfile.mkdtemp(prefix="reliability-pubsub-")))
        emulator = self._context.__enter__()
        self.emulator = emulator
        self.env.set("PUBSUB_EMULATOR_HOST", emulator.host)
        self.conn_id = self.env.connection("gcp_reliability", emulator.connection())
        self.contract = PubSubContractBroker(emulator)

    def stop_broker(self) -> None:
        # The emulator keeps topics, subscriptions and messages in memory only: a restarted one
        # is empty. A frozen one keeps them, and to its clients it is a broker that stopped
        # answering mid-call, which is the outage that matters to them.
        self.emulator.freeze()

    def start_broker(self) -> None:
        self.emulator.resume()

    def close(self) -> None:
        self._context.__exit__(None, None, None)  # resumes a frozen emulator before stopping it
        super().close()


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
        self.server = ServiceBusServer(sas_keys={key_name: key})
        self.server.start()
        self.conn_id = self.env.connection(
            "azure_service_bus_reliability", self.server.connection(key_name=key_name, key=key)
        )
        self.contract = ServiceBusContractBroker(self.server)

    def stop_broker(self) -> None:
        self.server.stop()

    def start_broker(self) -> None:
        # Entities, messages and locks live in the server object: a new listener on the same
        # port serves the same state, as a namespace does after a gateway restart.
        self.server.start()

    def close(self) -> None:
        self.server.stop()
        super().close()


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
