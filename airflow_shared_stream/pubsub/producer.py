"""
The Pub/Sub half of a shared stream: one subscriber per subscription, on the leased-queue template.

========  ================================================================================
ACK       ``acknowledge`` (up to 1000 ack ids per call)
REDELIVER ``modify_ack_deadline`` 0: Pub/Sub hands the message out again at once
DEAD      ``publish`` a copy (data, attributes, ordering key, plus ``dead_letter_reason``,
LETTER    ``dead_letter_description`` and the origin as attributes) to ``dead_letter_topic``,
          else to the topic of the subscription's dead-letter policy, then ``acknowledge``.
          Never a nack: Pub/Sub would hand the message out again, and every watcher that
          accepted it would fire again on each delivery until the policy moved it. With
          neither topic, a watcher with a ``reject`` expression is refused at start
          (:mod:`~airflow_shared_stream.common.reject_routes`); what is still rejected
          (undecodable, too large, an expression that failed) is acknowledged and logged
========  ================================================================================

While a message waits for its trigger events to be persisted, its ack deadline is extended with
``modify_ack_deadline`` (:class:`~airflow_shared_stream.common.leases.LeaseKeeper`, to the
subscription's ``ack_deadline_seconds`` each time, for at most the triggerer's ack timeout), so
Pub/Sub does not hand it out again while it is still outstanding.

Receiving: unary ``pull`` for exactly the free credits of the window (:mod:`.client` says why
not ``streaming_pull``). Lanes: on a subscription with message ordering, each
``ordering_key`` is an ordered lane (a redelivered message redelivers the later in-flight
messages of its key too, which is also what Pub/Sub itself does); messages without a key, and
every message of a subscription without ordering, share an advance lane per pull.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from airflow_shared_stream.common import flow_control
from airflow_shared_stream.common.errors import require_sdk
from airflow_shared_stream.common.leased_queue import DeadLetter, Delivery, LeasedQueueProducer
from airflow_shared_stream.common.matching import build_message
from airflow_shared_stream.common.metrics import stream_label
from airflow_shared_stream.common.reject_routes import reject_routes
from airflow_shared_stream.common.trigger import DEFAULT_MAX_PAYLOAD_BYTES
from airflow_shared_stream.pubsub.client import ACK_IDS_PER_CALL, PULL_LIMIT, PubSubClient
from airflow_shared_stream.pubsub.dead_letter import (
    ATTRIBUTE_VALUE_LIMIT,
    DEAD_LETTER_DESCRIPTION,
    DEAD_LETTER_ORIGIN_MESSAGE_ID,
    DEAD_LETTER_ORIGIN_PUBLISH_TIME,
    DEAD_LETTER_ORIGIN_SUBSCRIPTION,
    DEAD_LETTER_REASON,
    PUBLISH_REQUEST_BYTES,
    copy_for_dead_letter,
    request_size,
    truncate_utf8,
)
from airflow_shared_stream.pubsub.errors import NOWHERE_TO_DEAD_LETTER_FIX, PubSubConfigurationError
from airflow_shared_stream.pubsub.hook import PubSubSharedStreamHook, ResourceName

require_sdk("google.pubsub_v1", "pubsub")

log = logging.getLogger(__name__)

PULLS_IN_FLIGHT = 2
"""Unary pulls in flight at once, each for at most half the credit window (one on a subscription
with message ordering).

A pull's round trip, not the fan-out, sets the stream's pace at a few watchers (the emulator
hands out at most 100 messages per pull): two pulls overlap those waits, and the window still
bounds what the two hold together."""
PULL_WAIT_SECONDS = 10.0
"""Long-poll wait of one pull: Pub/Sub answers as soon as messages are there."""
CLOSE_NACK_SECONDS = 5.0
"""How long closing the stream may spend giving unsettled messages back."""
DEFAULT_RETENTION_SECONDS = 7 * 24 * 60 * 60
"""A subscription's message retention when it reports none (Pub/Sub's default, 7 days)."""
"""How long closing the stream may spend giving unsettled messages back."""
PUBLISH_LIMIT = 1000
"""Most messages in one ``publish`` request."""
PUBLISH_BYTES = PUBLISH_REQUEST_BYTES - 512
"""Bytes of dead-letter copies per ``publish`` request: Pub/Sub's limit, less room for the topic's
name (``projects/<at most 30>/topics/<at most 255>``). A copy fitted to the limit with its topic
(:func:`~airflow_shared_stream.pubsub.dead_letter.copy_for_dead_letter`) goes alone."""

"""What a refused ``reject`` says to do (:mod:`~airflow_shared_stream.common.reject_routes`)."""


@dataclass(slots=True)
class PubSubMessageHandle:
    """What the settlement calls need for one pulled message."""

    ack_id: str
    message_id: str
    data: bytes
    attributes: dict[str, str]
    ordering_key: str
    publish_time: str


class PubSubSharedStreamProducer(LeasedQueueProducer[PubSubMessageHandle]):
    """
    Pull from one subscription for every watcher that shares it, and settle per the table.

    Built by :meth:`PubSubSharedStreamTrigger.create_shared_stream_producer` from the first
    watcher's arguments; connects (and creates its asyncio clients) only in :meth:`open_stream`,
    on the triggerer's event loop.
    """

    broker = "pubsub"
    sdk_modules = (
        "google.pubsub_v1",
        "google.pubsub_v1.services.subscriber.transports",
        "google.api_core.retry_async",
        "google.oauth2.service_account",
        "grpc.aio",
    )
    client_class: ClassVar[type[PubSubClient]] = PubSubClient
    """The client the stream talks through (tests swap in one that records what the broker accepted)."""
    receive_limit = PULL_LIMIT
    locks_lanes = False  # an ordering key is not locked: a pull may bring a key's later message first
    receives_in_flight = PULLS_IN_FLIGHT
    settle_batch_limit = ACK_IDS_PER_CALL
    dead_letter_batch_limit = PUBLISH_LIMIT
    dead_letter_batch_bytes = PUBLISH_BYTES
    # A pull still waiting takes what the close nacks, and on a subscription with a dead-letter
    # policy Pub/Sub counts that delivery: the close gives back once the pulls returned.
    receives_take_given_back = True

    def __init__(
        self,
        *,
        subscription: str,
        project_id: str | None,
        gcp_conn_id: str,
        dead_letter_topic: str | None,
        max_in_flight: int,
        max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES,
        rpc_timeout: float = 30.0,
        pull_wait_seconds: float = PULL_WAIT_SECONDS,
    ) -> None:
        self._subscription_name = ResourceName.parse(subscription, "subscriptions", "subscription")
        self._label_prefix = f"{self._subscription_name.id}/"
        self._dead_letter_name = (
            ResourceName.parse(dead_letter_topic, "topics", "dead_letter_topic")
            if dead_letter_topic
            else None
        )
        super().__init__(max_in_flight=max_in_flight, stream_label=stream_label(self._subscription_name.id))
        self._project_id = project_id
        self._gcp_conn_id = gcp_conn_id
        self._max_payload_bytes = max_payload_bytes
        self._rpc_timeout = rpc_timeout
        self._pull_wait_seconds = pull_wait_seconds
        # Pulls cancelled on close take what is nacked until their deadline (the emulator does):
        # let them return first, then nack all the stream holds (LeasedQueueProducer.aclose).
        self.receive_wait_on_close = pull_wait_seconds + 1.0
        self._client: PubSubClient | None = None
        self.subscription: str | None = None
        """The subscription's full path, once connected."""
        self.dead_letter_topic: str | None = None
        """Where rejected messages are published, once connected: ``dead_letter_topic``, else the
        topic of the subscription's dead-letter policy (``None``: neither)."""
        self._ordered = False
        self._retention_seconds = DEFAULT_RETENTION_SECONDS

    # -- connection ---------------------------------------------------------------------------

    async def connect(self) -> float:
        config = await PubSubSharedStreamHook(self._gcp_conn_id).aget_client_config()
        # The rule the trigger's stream key follows: project_id, else the full path's project,
        # else the project the connection names.
        project = self._project_id or (None if self._subscription_name.project else config.project)
        self.subscription = self._subscription_name.resolve(project)
        if self._dead_letter_name is not None:
            self.dead_letter_topic = self._dead_letter_name.resolve(
                self._dead_letter_name.project or self.subscription.split("/")[1]
            )
        self._client = self.client_class(config, gcp_conn_id=self._gcp_conn_id, rpc_timeout=self._rpc_timeout)
        self._client.open()
        subscription = await self._client.get_subscription(self.subscription)
        if subscription.push_config.push_endpoint:
            raise PubSubConfigurationError(
                f"subscription {self.subscription} is a push subscription (it pushes to an endpoint); "
                "the shared stream pulls: give it a pull subscription"
            )
        policy_topic = subscription.dead_letter_policy.dead_letter_topic or None
        if self.dead_letter_topic is not None:
            if self.dead_letter_topic == subscription.topic:
                raise PubSubConfigurationError(
                    f"dead_letter_topic {self.dead_letter_topic} is the topic subscription "
                    f"{self.subscription} reads: rejected messages would come straight back"
                )
        else:
            # Rejected messages are published to the policy's topic by us, not nacked to the
            # policy: a nack hands the message out again, and every watcher that accepted it
            # fires again on each delivery until the policy gives up on it.
            self.dead_letter_topic = policy_topic
        if self.dead_letter_topic is not None:
            await self._client.get_topic(self.dead_letter_topic)
        reject_routes().opened(
            self.subscription,
            self,
            self.dead_letter_topic,
            fix=NOWHERE_TO_DEAD_LETTER_FIX,
        )
        self._ordered = bool(subscription.enable_message_ordering)
        if self._ordered:
            # Batches of concurrent pulls are yielded as they return: keep an ordering key's
            # messages in the order Pub/Sub handed them out.
            self.receives_in_flight = 1
        lease_seconds = max(10, int(subscription.ack_deadline_seconds or 10))
        retention = subscription.message_retention_duration
        if retention:
            self._retention_seconds = retention.total_seconds()
        log.info(
            "Pub/Sub shared stream open: subscription=%s endpoint=%s credentials=%s ordered=%s "
            "ack_deadline=%ss dead_letter_topic=%s subscription_dead_letter_policy=%s max_in_flight=%d",
            self.subscription,
            self._client.endpoint,
            config.credentials_source,
            self._ordered,
            lease_seconds,
            self.dead_letter_topic,
            policy_topic,
            self.credits.max_in_flight,
        )
        if self.dead_letter_topic is None:
            log.warning(
                "Subscription %s has no dead_letter_topic and no dead-letter policy: watchers with a "
                "reject expression are refused, and messages that cannot be processed are "
                "acknowledged and logged, not kept. Give the trigger a dead_letter_topic or the "
                "subscription a dead-letter policy.",
                self.subscription,
            )
        return lease_seconds

    def unseen_hold_limit(self, lease_seconds: float) -> float | None:
        """
        Pub/Sub renews an ack deadline (up to 600 s a call) for as long as it keeps the message:
        the subscription's message retention, from publication. A message reaches nobody at most
        the ack timeout after it was pulled, and a renewal grants one ack deadline ahead.
        """
        return self._retention_seconds - flow_control.ack_timeout_seconds() - lease_seconds

    async def release_unsettled(self, deliveries: Sequence[Delivery[PubSubMessageHandle]]) -> None:
        """
        Nack every message the closing stream still holds, so Pub/Sub hands it out now.

        A group closes when its last watcher leaves or fails, or the triggerer stops. Its
        unsettled messages would otherwise stay leased until their ack deadline (which the lease
        keeper may have pushed out), delaying the next triggerer's delivery. Nothing is lost
        either way: none of them was advanced (the template sends queued ACKs before this).
        """
        if self._client is not None:
            await asyncio.wait_for(self.redeliver(deliveries), timeout=CLOSE_NACK_SECONDS)

    async def disconnect(self) -> None:
        if self.subscription is not None:
            reject_routes().closed(self.subscription, self)
        if self._client is not None:
            await self._client.close()
            self._client = None

    @property
    def client(self) -> PubSubClient:
        if self._client is None:
            raise RuntimeError("the Pub/Sub shared stream is not connected")
        return self._client

    # -- receiving ----------------------------------------------------------------------------

    async def receive(self, max_messages: int) -> Sequence[Delivery[PubSubMessageHandle]]:
        assert self.subscription is not None
        received = await self.client.pull(self.subscription, max_messages, self._pull_wait_seconds)
        return [self._delivery(r) for r in received]

    def _delivery(self, received: Any) -> Delivery[PubSubMessageHandle]:
        """
        One pulled message (a raw protobuf ``ReceivedMessage``, see :meth:`PubSubClient.pull`).

        Each field is read once: reading a string field of a protobuf message builds a new
        Python string every time, and this runs once per message.
        """
        message = received.message
        message_id = message.message_id
        ordering_key = message.ordering_key
        stamp = message.publish_time
        publish_time = _rfc3339(stamp.seconds, stamp.nanos)
        # Most messages have none; dict() of a protobuf map goes through Python's Mapping methods.
        attributes = message.attributes
        attributes = dict(attributes) if attributes else {}
        data = message.data
        raw = build_message(
            data,
            metadata={
                "message_id": message_id,
                "publish_time": publish_time,
                "attributes": attributes,
                "ordering_key": ordering_key or None,
                # Pub/Sub counts delivery attempts only on subscriptions with a dead-letter policy.
                "delivery_attempt": received.delivery_attempt or None,
                "subscription": self.subscription,
            },
            label=self._label_prefix + message_id,
            max_payload_bytes=self._max_payload_bytes,
        )
        ack_id = received.ack_id
        return Delivery(  # message, handle, lease, lane, size, message_id
            raw,
            PubSubMessageHandle(ack_id, message_id, data, attributes, ordering_key, publish_time),
            ack_id,
            ordering_key if ordering_key and self._ordered else None,
            len(data),
            message_id,
        )

    # -- settlement ---------------------------------------------------------------------------

    async def ack(self, deliveries: Sequence[Delivery[PubSubMessageHandle]]) -> None:
        assert self.subscription is not None
        await self.client.acknowledge(self.subscription, [d.handle.ack_id for d in deliveries])

    async def redeliver(self, deliveries: Sequence[Delivery[PubSubMessageHandle]]) -> None:
        assert self.subscription is not None
        await self.client.modify_ack_deadline(self.subscription, [d.handle.ack_id for d in deliveries], 0)

    async def extend_leases(
        self, deliveries: Sequence[Delivery[PubSubMessageHandle]], seconds: float
    ) -> Collection[Delivery[PubSubMessageHandle]]:
        assert self.subscription is not None
        # Pub/Sub names the ack ids it refused only on a subscription with exactly-once delivery
        # (elsewhere an expired ack id is ignored and the message simply comes back).
        refused = await self.client.modify_ack_deadline(
            self.subscription, [d.handle.ack_id for d in deliveries], int(seconds)
        )
        return [d for d in deliveries if d.handle.ack_id in refused] if refused else ()

    def dead_letter_size(self, letter: DeadLetter[PubSubMessageHandle]) -> int:
        """The copy's share of a publish request, as Pub/Sub counts it (the serialized bytes)."""
        return request_size("", self._dead_letter_copy(letter))

    async def dead_letter(self, letters: Sequence[DeadLetter[PubSubMessageHandle]]) -> None:
        assert self.subscription is not None
        if self.dead_letter_topic is None:
            await self._acknowledge_with_nowhere_to_go(letters)
            return
        copies = [self._dead_letter_copy(letter) for letter in letters]
        # Publish first and acknowledge only what Pub/Sub has accepted: a failed publish raises,
        # the batch is not acknowledged, and the messages come back.
        await self.client.publish(self.dead_letter_topic, copies)
        await self.client.acknowledge(
            self.subscription, [letter.delivery.handle.ack_id for letter in letters]
        )
        log.info(
            "Dead-lettered %d message(s) of %s to %s: %s",
            len(letters),
            self.subscription,
            self.dead_letter_topic,
            ", ".join(letter.delivery.message_id for letter in letters),
        )

    def _dead_letter_copy(self, letter: DeadLetter[PubSubMessageHandle]) -> Any:
        """The raw ``PubsubMessage`` to publish: the original, our attributes, within Pub/Sub's limits."""
        handle = letter.delivery.handle
        ours = {
            DEAD_LETTER_REASON: letter.reason,
            DEAD_LETTER_DESCRIPTION: truncate_utf8(letter.description or "-", ATTRIBUTE_VALUE_LIMIT),
            DEAD_LETTER_ORIGIN_SUBSCRIPTION: self.subscription or "",
            DEAD_LETTER_ORIGIN_MESSAGE_ID: handle.message_id,
            DEAD_LETTER_ORIGIN_PUBLISH_TIME: handle.publish_time,
        }
        return copy_for_dead_letter(
            topic=self.dead_letter_topic or "",
            data=handle.data,
            attributes=handle.attributes,
            ordering_key=handle.ordering_key,
            ours=ours,
        )

    async def _acknowledge_with_nowhere_to_go(
        self, letters: Sequence[DeadLetter[PubSubMessageHandle]]
    ) -> None:
        """
        Acknowledge what was rejected on a stream with nowhere to dead-letter, and log each.

        Only messages no ``reject`` expression chose get here (watchers with one are refused on
        such a stream): undecodable or too large, or an expression that failed on them. Handed out
        again, they would fail again and fire every watcher that accepted them again.
        """
        assert self.subscription is not None
        await self.client.acknowledge(
            self.subscription, [letter.delivery.handle.ack_id for letter in letters]
        )
        for letter in letters:
            log.error(
                "Message %s of %s was %s and the subscription has nowhere to dead-letter it (no "
                "dead_letter_topic, no dead-letter policy): acknowledged, not kept: %s",
                letter.delivery.message_id,
                self.subscription,
                letter.reason,
                letter.description,
            )


@functools.lru_cache(maxsize=256)
def _rfc3339(seconds: int, nanos: int) -> str:
    """
    A protobuf ``Timestamp`` as RFC 3339 in UTC, as the SDK's ``DatetimeWithNanoseconds`` writes it.

    Six fraction digits when the nanoseconds are zero, else the nanoseconds without trailing
    zeros: ``2026-11-22T04:30:00.000000Z``, ``2026-11-22T04:30:00.123456789Z``. Cached: Pub/Sub
    stamps every message of one ``Publish`` request with the same time, and publishers batch
    (the client libraries send up to 100 messages per request by default), so the messages of a
    pull share a few publish times; a hit costs half the formatting.
    """
    fraction = ("%09d" % nanos).rstrip("0") if nanos else "000000"  # noqa: UP031 - twice as fast here
    return f"{_utc_seconds(seconds)}.{fraction}Z"


@functools.lru_cache(maxsize=64)
def _utc_seconds(seconds: int) -> str:
    """The whole-second part of :func:`_rfc3339`; a pull's messages share a few publish seconds."""
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds))
