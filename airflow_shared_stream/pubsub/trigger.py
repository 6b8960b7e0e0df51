"""``PubSubSharedStreamTrigger``: watch a Pub/Sub subscription from any number of AssetWatchers."""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterator
from contextlib import contextmanager
from typing import Any

from airflow_shared_stream.common.errors import require_sdk
from airflow_shared_stream.common.matching import RawMessage
from airflow_shared_stream.common.reject_routes import reject_routes
from airflow_shared_stream.common.trigger import (
    DEFAULT_MAX_IN_FLIGHT,
    DEFAULT_MAX_PAYLOAD_BYTES,
    SharedStreamTrigger,
    connection_endpoints,
)
from airflow_shared_stream.pubsub.errors import NOWHERE_TO_DEAD_LETTER_FIX, PubSubConfigurationError
from airflow_shared_stream.pubsub.hook import PubSubSharedStreamHook, ResourceName, validate_project_id

require_sdk("google.pubsub_v1", "pubsub")


class PubSubSharedStreamTrigger(SharedStreamTrigger):
    """
    Fire an asset event for each Pub/Sub message this watcher's ``match`` selects, at least once.

    Every trigger on the same subscription shares one subscriber in the triggerer; each sees
    every message. The stream is the subscription's full path, and nothing else: a short name and
    ``projects/<p>/subscriptions/<s>`` of one subscription are one stream, whatever the tuning
    arguments. A message is acknowledged only after every watcher online when it arrived has
    moved past it and its asset events are persisted; a watcher that fails makes it come back
    (``modify_ack_deadline`` 0); a ``reject`` dead-letters it. The trigger event payload is the
    message envelope::

        {"message_id": ..., "publish_time": "2026-11-22T04:30:00.123456Z",
         "body": <the message data: a JSON value, text, or base64 with "body_encoding": "base64">,
         "attributes": {...}, "ordering_key": ... or None, "delivery_attempt": ... or None,
         "subscription": "projects/<p>/subscriptions/<s>"}

    :param subscription: a subscription id, or ``projects/<project>/subscriptions/<id>``.
    :param project_id: the project of a short subscription name; defaults to the project the
        connection names (``extra.project``, else its key's ``project_id``).
    :param gcp_conn_id: ``google_cloud_platform`` connection with the credentials
        (``google_cloud_default``); application default credentials if it has no key.
    :param match: JMESPath over the envelope; truthy fires an event. ``None`` matches everything.
    :param reject: JMESPath over the envelope; truthy dead-letters the message.
    :param dead_letter_topic: a topic id (in the subscription's project) or full path. Rejected
        messages are published there, with ``dead_letter_reason``, ``dead_letter_description``
        and ``dead_letter_origin_*`` attributes, then acknowledged. Without it they are published
        the same way to the topic of the subscription's dead-letter policy. With neither, a
        watcher with a ``reject`` expression is refused at start.
    :param max_in_flight: most messages pulled and not yet settled.
    :param max_payload_bytes: largest message data turned into an event; larger ones are
        dead-lettered.

    ``gcp_conn_id``, ``dead_letter_topic``, ``max_in_flight`` and ``max_payload_bytes`` shape the
    one subscriber: every watcher of a subscription must give the same values (a watcher that
    disagrees fails at start, naming the argument). ``match`` and ``reject`` are each watcher's own.
    """

    broker = "pubsub"
    identity_fields = ("subscription", "project_id")
    shaping_fields = ("gcp_conn_id", "dead_letter_topic")
    producer_path = "airflow_shared_stream.pubsub.producer:PubSubSharedStreamProducer"
    """The producer the triggerer builds for this trigger's stream (a subclass may swap it)."""

    def __init__(
        self,
        subscription: str,
        *,
        project_id: str | None = None,
        gcp_conn_id: str = PubSubSharedStreamHook.default_conn_name,
        match: str | None = None,
        reject: str | None = None,
        dead_letter_topic: str | None = None,
        max_in_flight: int = DEFAULT_MAX_IN_FLIGHT,
        max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES,
    ) -> None:
        super().__init__(
            match=match, reject=reject, max_in_flight=max_in_flight, max_payload_bytes=max_payload_bytes
        )
        self._subscription = ResourceName.parse(subscription, "subscriptions", "subscription")
        validate_project_id(project_id)
        if project_id is not None and self._subscription.project not in (None, project_id):
            self._subscription.resolve(project_id)  # raises, naming both projects
        self._dead_letter = (
            ResourceName.parse(dead_letter_topic, "topics", "dead_letter_topic")
            if dead_letter_topic
            else None
        )
        if not gcp_conn_id or not isinstance(gcp_conn_id, str):
            raise PubSubConfigurationError("gcp_conn_id must name an Airflow connection")
        self.subscription = subscription
        self.project_id = project_id
        self.gcp_conn_id = gcp_conn_id
        self.dead_letter_topic = dead_letter_topic
        self._resolved_project: str | None = None

    def metrics_stream_name(self) -> str:
        return self._subscription.id

    def project(self) -> str | None:
        """
        The subscription's project: ``project_id``, the full path's, or the connection's.

        Read from the connection at most once per trigger, and only in the triggerer (the stream
        key is computed there), never while a Dag file is parsed. ``None`` if nothing names one.
        """
        if self._resolved_project is None:
            project = self.project_id or self._subscription.project
            if project is None:
                project = connection_endpoints.resolve(
                    self.broker, self.gcp_conn_id, self._connection_project
                )
                if project is None:
                    return None
            self._resolved_project = project
        return self._resolved_project

    def _connection_project(self) -> str:
        project = PubSubSharedStreamHook(self.gcp_conn_id).connection_project()
        if project is None:
            raise PubSubConfigurationError(
                f"connection {self.gcp_conn_id!r} names no project for subscription {self.subscription!r}"
            )
        return project

    def stream_identity(self) -> tuple[Hashable, ...]:
        project = self.project()
        if project is None:
            # Unresolvable here: keep a key of its own, and let the producer fail the stream with
            # the error that says what is missing (it resolves by the same rule).
            return ("unresolved", self.gcp_conn_id, self._subscription.id)
        return (self._subscription.resolve(project),)

    def normalized_shape(self) -> dict[str, Any]:
        shape = super().normalized_shape()
        if self._dead_letter is not None:
            project = self._dead_letter.project or self.project()
            shape["dead_letter_topic"] = (
                self._dead_letter.resolve(project) if project is not None else self.dead_letter_topic
            )
        return shape

    @contextmanager
    def _watching(self) -> Iterator[Callable[[RawMessage], bool] | None]:
        """
        The base's, and a ``reject`` refused at start when the stream has nowhere to dead-letter.

        A reject given back to Pub/Sub instead would be handed out again and fire every watcher
        that accepted it again (:mod:`~airflow_shared_stream.common.reject_routes`).
        """
        identity = self.stream_identity()
        with super()._watching() as passed:
            if len(identity) != 1:  # an unresolved project: the producer fails the stream
                yield passed
                return
            with reject_routes().watching(
                identity[0],
                self._watcher_name(),
                rejects=self.reject is not None,
                fix=NOWHERE_TO_DEAD_LETTER_FIX,
            ):
                yield passed
