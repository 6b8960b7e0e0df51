"""``ServiceBusSharedStreamTrigger``: watch a queue or a subscription from any number of AssetWatchers."""

from __future__ import annotations

import warnings
from collections.abc import Hashable
from typing import Any

from airflow.exceptions import AirflowProviderDeprecationWarning

from airflow_shared_stream.common.errors import require_sdk
from airflow_shared_stream.common.trigger import (
    DEFAULT_MAX_IN_FLIGHT,
    DEFAULT_MAX_PAYLOAD_BYTES,
    SharedStreamTrigger,
    connection_endpoints,
)
from airflow_shared_stream.servicebus.errors import ServiceBusConfigurationError
from airflow_shared_stream.servicebus.hook import Entity, ServiceBusSharedStreamHook

require_sdk("azure.servicebus", "servicebus")


class ServiceBusSharedStreamTrigger(SharedStreamTrigger):
    """
    Fire an asset event for each Service Bus message this watcher's ``match`` selects, at least once.

    Every trigger on the same entity (a queue, or a topic's subscription) through the same
    connection shares one peek-lock receiver in the triggerer; each sees every message. A message
    is completed only after every watcher online when it arrived has moved past it and its asset
    events are persisted; a watcher that fails makes it come back (abandoned, delivery count + 1);
    a ``reject`` dead-letters it with the rejecting watcher named in the description. The trigger
    event payload is the message envelope::

        {"body": <JSON object, or text>, "message_id": ..., "sequence_number": ...,
         "enqueued_time": "<ISO 8601>", "delivery_count": ..., "application_properties": {...},
         "content_type": ..., "correlation_id": ..., "subject": ..., "session_id": ...,
         "entity": "<queue or topic/Subscriptions/sub>", "namespace": ...}

    :param queue_name: the queue to watch; or
    :param topic_name: the topic, with
    :param subscription_name: the subscription to watch (exactly one queue, or a topic with a
        subscription).
    :param azure_service_bus_conn_id: ``azure_service_bus`` connection (a connection string, or
        a fully qualified namespace with a credential), as Airflow's Azure provider reads it.
    :param match: JMESPath over the envelope; truthy fires an event. ``None`` matches everything.
    :param reject: JMESPath over the envelope; truthy dead-letters the message.
    :param max_in_flight: most messages received and not yet settled.
    :param max_payload_bytes: largest body turned into an event; larger ones are dead-lettered.
    :param lock_duration_seconds: deprecated and ignored: locks are renewed from the expiry Service
        Bus gives each message (and each session), whatever the entity's lock duration. Accepted so
        that Dags serialized with it still load.
    :param max_wait_time: seconds one receive call waits for a message.
    :param session_enabled: the entity requires sessions: each session is an ordered lane.
    :param max_concurrent_sessions: sessions held at once on a session-enabled entity.
    :param complete_in_ranges: complete consecutive messages with one AMQP disposition per run
        instead of one ``complete_message`` each (see
        :mod:`airflow_shared_stream.servicebus.ranges`); ``False`` completes them one by one.

    The stream is the entity (names are case-insensitive) of the namespace the connection
    resolves to, normalised (host case, scheme, trailing slash and the port the SDK would use;
    a connection string or ``extra.fully_qualified_namespace``): watchers whose connections
    spell one namespace differently, or two connection ids with the same connection string,
    share one receiver, built from the first watcher's connection. Every other argument but
    ``match`` and ``reject`` (and the ignored ``lock_duration_seconds``) shapes the one
    receiver: every watcher of the entity must give the same values (a watcher that disagrees
    fails at start, naming the argument).
    """

    broker = "servicebus"
    identity_fields = ("queue_name", "topic_name", "subscription_name", "azure_service_bus_conn_id")
    shaping_fields = (
        "max_wait_time",
        "session_enabled",
        "max_concurrent_sessions",
        "complete_in_ranges",
    )
    producer_path = "airflow_shared_stream.servicebus.producer:ServiceBusSharedStreamProducer"
    """The producer the triggerer builds for this trigger's stream (a subclass may swap it)."""

    def __init__(
        self,
        queue_name: str | None = None,
        topic_name: str | None = None,
        subscription_name: str | None = None,
        *,
        azure_service_bus_conn_id: str = ServiceBusSharedStreamHook.default_conn_name,
        match: str | None = None,
        reject: str | None = None,
        max_in_flight: int = DEFAULT_MAX_IN_FLIGHT,
        max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES,
        lock_duration_seconds: float | None = None,
        max_wait_time: float = 5.0,
        session_enabled: bool = False,
        max_concurrent_sessions: int = 8,
        complete_in_ranges: bool = True,
    ) -> None:
        super().__init__(
            match=match, reject=reject, max_in_flight=max_in_flight, max_payload_bytes=max_payload_bytes
        )
        self._entity = Entity.of(queue_name, topic_name, subscription_name)
        if not isinstance(azure_service_bus_conn_id, str) or not azure_service_bus_conn_id:
            raise ServiceBusConfigurationError("azure_service_bus_conn_id must name an Airflow connection")
        if lock_duration_seconds is not None:
            warnings.warn(
                f"{type(self).__name__}(lock_duration_seconds=...) is deprecated and ignored: locks "
                "are renewed from the expiry Service Bus gives each message and session",
                AirflowProviderDeprecationWarning,
                stacklevel=2,
            )
        if isinstance(max_wait_time, bool) or not 0 < float(max_wait_time) <= 60:
            raise ServiceBusConfigurationError(
                f"max_wait_time must be 0 < seconds <= 60, got {max_wait_time!r}"
            )
        if not isinstance(session_enabled, bool):
            raise ServiceBusConfigurationError(
                f"session_enabled must be True or False, got {session_enabled!r}"
            )
        if (
            isinstance(max_concurrent_sessions, bool)
            or not isinstance(max_concurrent_sessions, int)
            or not (1 <= max_concurrent_sessions <= 100)
        ):
            raise ServiceBusConfigurationError(
                f"max_concurrent_sessions must be an int from 1 to 100, got {max_concurrent_sessions!r}"
            )
        if not isinstance(complete_in_ranges, bool):
            raise ServiceBusConfigurationError(
                f"complete_in_ranges must be True or False, got {complete_in_ranges!r}"
            )
        self.queue_name = queue_name
        self.topic_name = topic_name
        self.subscription_name = subscription_name
        self.azure_service_bus_conn_id = azure_service_bus_conn_id
        self.max_wait_time = max_wait_time
        self.session_enabled = session_enabled
        self.max_concurrent_sessions = max_concurrent_sessions
        self.complete_in_ranges = complete_in_ranges
        self._namespace: str | None = None

    def metrics_stream_name(self) -> str:
        return self._entity.identity

    def stream_identity(self) -> tuple[Hashable, ...]:
        """The namespace the connection resolves to and the entity: not the connection id."""
        if self._namespace is None:
            conn_id = self.azure_service_bus_conn_id
            self._namespace = connection_endpoints.resolve(
                self.broker, conn_id, ServiceBusSharedStreamHook(conn_id).namespace
            )
        if self._namespace is None:
            # Unreadable here: a key of its own; the producer fails the stream saying why.
            return ("unresolved", self.azure_service_bus_conn_id, self._entity.identity)
        return (self._namespace, self._entity.identity)

    def normalized_shape(self) -> dict[str, Any]:
        shape = super().normalized_shape()
        shape["max_wait_time"] = float(self.max_wait_time)
        return shape
