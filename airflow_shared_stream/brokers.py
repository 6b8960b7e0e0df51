"""
The brokers this provider knows: one registry line each.

The Streams page, the redrive entry point and the ``MessageQueueTrigger`` schemes iterate
:data:`REGISTRY` and name no broker; each broker answers for itself through the
:class:`~airflow_shared_stream.common.operations.BrokerOperations` of its ``operations.py``.
A line names the module, not the object: each broker's SDK is an extra of its own, so a
broker's module is imported only when one of its streams, redrives or schemes is used, and a
deployment with only some extras still lists every scheme.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass

from airflow_shared_stream.common.operations import BrokerOperations


@dataclass(frozen=True)
class RegisteredBroker:
    name: str
    """The broker's name: its trigger's ``broker``, a redrive's ``broker``, its scheme's suffix."""
    title: str
    """Its spelling in class names (``PubSub``):
    its scheme's provider is ``<title>SharedStreamQueueProvider``."""
    operations_module: str
    """The module whose ``OPERATIONS`` answers for the broker (imported on first use)."""

    @property
    def scheme(self) -> str:
        """Its common.messaging ``MessageQueueTrigger`` scheme."""
        return f"shared+{self.name}"

    @property
    def classpath_prefix(self) -> str:
        """What the classpaths of its triggers start with: its package's."""
        return self.operations_module.rpartition(".")[0] + "."

    def operations(self) -> BrokerOperations:
        found: BrokerOperations = importlib.import_module(self.operations_module).OPERATIONS
        return found


REGISTRY: tuple[RegisteredBroker, ...] = (
    RegisteredBroker("kafka", "Kafka", "airflow_shared_stream.kafka.operations"),
    RegisteredBroker("sqs", "Sqs", "airflow_shared_stream.sqs.operations"),
    RegisteredBroker("pubsub", "PubSub", "airflow_shared_stream.pubsub.operations"),
    RegisteredBroker("servicebus", "ServiceBus", "airflow_shared_stream.servicebus.operations"),
)


def registered_brokers() -> tuple[RegisteredBroker, ...]:
    """Every registered broker, in registry order."""
    return REGISTRY


def broker_names() -> tuple[str, ...]:
    return tuple(broker.name for broker in registered_brokers())


def registered_broker(name: str) -> RegisteredBroker | None:
    return next((broker for broker in registered_brokers() if broker.name == name), None)


def broker_operations(name: str) -> BrokerOperations | None:
    """The operations of the broker named ``name`` (importing its module), ``None`` if none is."""
    broker = registered_broker(name)
    return broker.operations() if broker is not None else None
