"""
Redrive from a Pub/Sub dead-letter subscription to the original topic (common/redrive.py's protocol).

The dead-letter subscription is a subscription on the dead-letter topic. Each message is
published to the original topic (``source``) with its data, attributes and ordering key, and
acknowledged on the dead-letter subscription only after Pub/Sub returned its new message id.
A topic reaches every subscription on it: a message redriven to a topic with several
subscriptions is delivered to each of them again (docs/redrive.rst).

Where a message goes (the origin rule, docs/redrive.rst): our dead-lettering stamps each copy
with the subscription it was rejected from (``dead_letter_origin_subscription``); Pub/Sub's own
dead-letter policy stamps ``CloudPubSubDeadLetterSourceSubscription`` (and its project). A
message is published to ``source`` only when that subscription is one of ``source``'s; one from
a subscription of another topic, of a subscription that no longer exists, or with no origin, is
left untouched. A copy our dead-lettering had to cut (``dead_letter_truncated_from``) or strip
of attributes (``dead_letter_attributes_dropped``) is not the original and is left too.

Pulled messages get the redrive's own ack deadline (``lease_seconds``), extended while the
redrive holds them; one handed out again anyway is recognised by its message id. Pub/Sub cannot
count a subscription's messages without a monitoring API, so the snapshot is a time: a message
published to the dead-letter topic after the redrive started (a copy dead-lettered again) is held
and given back at the end, never examined.
"""

from __future__ import annotations

import datetime
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from airflow_shared_stream.common.matching import build_message
from airflow_shared_stream.common.redrive import RedriveItem, RedriveRoute, RedriveSnapshot
from airflow_shared_stream.common.trigger import DEFAULT_MAX_PAYLOAD_BYTES
from airflow_shared_stream.pubsub.client import PubSubClient
from airflow_shared_stream.pubsub.dead_letter import (
    DEAD_LETTER_ATTRIBUTES_DROPPED,
    DEAD_LETTER_DESCRIPTION,
    DEAD_LETTER_ORIGIN_MESSAGE_ID,
    DEAD_LETTER_ORIGIN_PUBLISH_TIME,
    DEAD_LETTER_ORIGIN_SUBSCRIPTION,
    DEAD_LETTER_REASON,
    DEAD_LETTER_TRUNCATED_FROM,
)
from airflow_shared_stream.pubsub.errors import PubSubConfigurationError, PubSubSharedStreamError
from airflow_shared_stream.pubsub.hook import PubSubSharedStreamHook, ResourceName

log = logging.getLogger(__name__)

ORIGIN_ATTRIBUTES = frozenset(
    (
        DEAD_LETTER_REASON,
        DEAD_LETTER_DESCRIPTION,
        DEAD_LETTER_ORIGIN_SUBSCRIPTION,
        DEAD_LETTER_ORIGIN_MESSAGE_ID,
        DEAD_LETTER_ORIGIN_PUBLISH_TIME,
        DEAD_LETTER_ATTRIBUTES_DROPPED,
        DEAD_LETTER_TRUNCATED_FROM,
    )
)
"""The attributes our dead-lettering adds (stripped unless ``keep_origin_attributes``)."""
PULL_WAIT_SECONDS = 2.0
SERVICE_ORIGIN_SUBSCRIPTION = "CloudPubSubDeadLetterSourceSubscription"
SERVICE_ORIGIN_PROJECT = "CloudPubSubDeadLetterSourceSubscriptionProject"
"""What Pub/Sub's dead-letter policy writes on the messages it forwards: where they came from."""


@dataclass(frozen=True, slots=True)
class HeldMessage:
    """What a redrive keeps of a message it holds: the ack id, not the data."""

    ack_id: str


class PubSubDeadLetterSource:
    """
    Pull a dead-letter subscription; publish to ``source``; acknowledge what was published.

    :param dead_letter: the dead-letter subscription (id or ``projects/<p>/subscriptions/<id>``).
    :param source: the original topic (id or full path).
    """

    broker = "pubsub"

    def __init__(
        self,
        *,
        dead_letter: str,
        source: str | None,
        conn_id: str | None = None,
        keep_origin_attributes: bool = False,
        project_id: str | None = None,
        lease_seconds: int = 60,
    ) -> None:
        if not source:
            raise PubSubConfigurationError("a Pub/Sub redrive needs the original topic (source=...)")
        self._subscription_name = ResourceName.parse(dead_letter, "subscriptions", "dead_letter")
        self._topic_name = ResourceName.parse(source, "topics", "source")
        self._conn_id = conn_id or PubSubSharedStreamHook.default_conn_name
        self._keep = keep_origin_attributes
        self._project_id = project_id
        self.lease_seconds = lease_seconds
        self._started_ns: int | None = None
        """The snapshot: publish times after it (the service's clock, nanoseconds) are the next redrive's."""
        self._client: PubSubClient | None = None
        self.subscription = ""
        self.topic = ""
        self._reads_topic: str | None = None
        self._topic_of: dict[str, str | None] = {}
        """Origin subscription -> its topic (``None``: it does not exist or cannot be read)."""
        self.label = self._subscription_name.id

    @property
    def route(self) -> RedriveRoute:
        """The topic the dead-letter subscription reads is known once open (a broker call)."""
        return RedriveRoute("topic", read_from=self._reads_topic, write_to=self.topic or None)

    async def open(self) -> None:
        settings = await PubSubSharedStreamHook(self._conn_id).aget_client_config()
        project = self._project_id or settings.project
        self.subscription = self._subscription_name.resolve(self._subscription_name.project or project)
        self.topic = self._topic_name.resolve(self._topic_name.project or project)
        self._client = client = PubSubClient(settings, gcp_conn_id=self._conn_id)
        client.open()
        subscription = await client.get_subscription(self.subscription)
        await client.get_topic(self.topic)
        self._reads_topic = subscription.topic

    async def close(self) -> None:
        if self._client is not None:
            await self._client.close()
            self._client = None

    @property
    def client(self) -> PubSubClient:
        assert self._client is not None, "the redrive source is not open"
        return self._client

    async def snapshot(self) -> RedriveSnapshot:
        now = datetime.datetime.now(datetime.timezone.utc)
        self._started_ns = int(now.timestamp()) * 1_000_000_000 + now.microsecond * 1000
        return RedriveSnapshot(depth=None, bound=f"messages published before {now.isoformat()}")

    def held_handle(self, item: RedriveItem) -> Any:
        return HeldMessage(ack_id=item.handle.ack_id)

    async def renew(self, items: Sequence[RedriveItem]) -> None:
        await self.client.modify_ack_deadline(
            self.subscription, [item.handle.ack_id for item in items], self.lease_seconds
        )

    async def read(self, limit: int) -> Sequence[RedriveItem]:
        received = await self.client.pull(self.subscription, limit, PULL_WAIT_SECONDS)
        if received:  # hold them for the redrive, not for the subscription's deadline
            await self.client.modify_ack_deadline(
                self.subscription, [r.ack_id for r in received], self.lease_seconds
            )
        items = [self._item(r) for r in received]
        for item in items:
            item.leave = await self._leave(dict(item.handle.message.attributes))
        return items

    async def _leave(self, attributes: dict[str, str]) -> str | None:
        """Why this message must not be published to ``source`` (the module docstring), or None."""
        for marker in (DEAD_LETTER_TRUNCATED_FROM, DEAD_LETTER_ATTRIBUTES_DROPPED):
            if marker in attributes:
                return (
                    f"not the original ({marker}={attributes[marker]}): our dead-lettering had to cut "
                    "it to fit Pub/Sub's limits; recover the message from its publisher, or move "
                    "this copy by hand knowing it is incomplete"
                )
        # The policy's stamp first: Pub/Sub writes it on what it forwards (our dead-lettering drops
        # it from its copies), while ours may have come with the message from its publisher.
        origin = None
        if SERVICE_ORIGIN_SUBSCRIPTION in attributes:
            project = attributes.get(SERVICE_ORIGIN_PROJECT) or self.subscription.split("/")[1]
            origin = f"projects/{project}/subscriptions/{attributes[SERVICE_ORIGIN_SUBSCRIPTION]}"
        else:
            origin = attributes.get(DEAD_LETTER_ORIGIN_SUBSCRIPTION)
        if not origin:
            return "no origin subscription recorded: which stream it came from is not known"
        if origin not in self._topic_of:
            try:
                self._topic_of[origin] = (await self.client.get_subscription(origin)).topic
            except PubSubSharedStreamError as exc:
                log.warning("Cannot read origin subscription %s: %s", origin, exc)
                self._topic_of[origin] = None
        topic = self._topic_of[origin]
        if topic == self.topic:
            return None
        if topic is None:
            return f"its origin subscription {origin} cannot be read: its topic is not known"
        return f"dead-lettered from {origin}, a subscription of another topic ({topic})"

    def _item(self, received: Any) -> RedriveItem:
        message = received.message
        attributes = dict(message.attributes)
        envelope = build_message(
            message.data,
            metadata={
                "message_id": message.message_id,
                "attributes": attributes,
                "ordering_key": message.ordering_key or None,
                "subscription": self.subscription,
            },
            label=f"{self.label}/{message.message_id}",
            max_payload_bytes=DEFAULT_MAX_PAYLOAD_BYTES,
        ).envelope
        stamp = message.publish_time
        published_ns = stamp.seconds * 1_000_000_000 + stamp.nanos
        past = self._started_ns is not None and published_ns > self._started_ns
        return RedriveItem(key=message.message_id, envelope=envelope, handle=received, past_snapshot=past)

    async def copy(self, items: Sequence[RedriveItem]) -> Sequence[RedriveItem]:
        from google.pubsub_v1 import types

        accepted = []
        for item in items:  # one request each: a refusal is one message's, never its batch's
            message = item.handle.message
            attributes = {
                k: v for k, v in message.attributes.items() if self._keep or k not in ORIGIN_ATTRIBUTES
            }
            copy = types.PubsubMessage.pb()(
                data=message.data, attributes=attributes, ordering_key=message.ordering_key
            )
            try:
                await self.client.publish(self.topic, [copy])
            except PubSubSharedStreamError as exc:
                log.warning("Pub/Sub refused the copy of %s: %s", item.key, exc)
                continue
            accepted.append(item)
        return accepted

    async def remove(self, moved: Sequence[RedriveItem], skipped: Sequence[RedriveItem]) -> None:
        if moved:
            await self.client.acknowledge(self.subscription, [item.handle.ack_id for item in moved])

    async def release(self, items: Sequence[RedriveItem]) -> None:
        try:
            await self.client.modify_ack_deadline(
                self.subscription, [item.handle.ack_id for item in items], 0
            )
        except PubSubSharedStreamError as exc:  # they come back when their deadline passes anyway
            log.warning("Could not give back %d message(s) to %s: %s", len(items), self.subscription, exc)


def dead_letter_source(**kwargs: Any) -> PubSubDeadLetterSource:
    return PubSubDeadLetterSource(**kwargs)
