"""
The Pub/Sub calls the shared stream makes, on google-cloud-pubsub's asyncio (GAPIC) clients.

One place builds the clients (inside the running event loop: gRPC's asyncio channels bind to the
loop they are created on), bounds every call with a retry deadline, and turns
``google.api_core`` errors into ones that name the problem, the resource and the connection id
and nothing else: the service's own message is scrubbed of the connection's key material
before it is quoted.

Why unary ``pull`` and not ``streaming_pull``: the shared stream's credit window decides how
many messages may be outstanding, and a unary pull asks for exactly the free credits; a
streaming pull's flow control is the server's to honour (the emulator pushed four times the
window), and messages a cancelled stream had received stayed leased far past their ack deadline
on the emulator.

The three calls of the hot path (``Pull``, ``Acknowledge``, ``ModifyAckDeadline``) go through
:class:`SubscriberCalls`: the generated client's channel and credentials, the metadata its
methods send, on raw protobuf messages. Everything else (``GetSubscription``, ``GetTopic``,
``Publish``) goes through the generated clients.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Any

from airflow_shared_stream.common.errors import SecretScrubber
from airflow_shared_stream.pubsub.errors import PubSubSharedStreamError, explain
from airflow_shared_stream.pubsub.hook import PubSubClientConfig

log = logging.getLogger(__name__)

ACK_IDS_PER_CALL = 1000
"""Ack ids per ``acknowledge`` / ``modify_ack_deadline`` call (the request limit is 512 KiB)."""
PULL_LIMIT = 1000
"""Most messages one ``pull`` may ask for."""
MAX_ACK_DEADLINE_SECONDS = 600
"""Pub/Sub's longest ack deadline."""
ACK_ID_RETRIES = 3
"""Times an ack id Pub/Sub failed transiently (exactly-once delivery) is sent again."""
ACK_ID_RETRY_SECONDS = 0.2
"""First pause before sending such ack ids again; doubles each time."""


class PubSubClient:
    """
    Subscriber (and, for dead-letter copies, publisher) client of one shared stream.

    :param config: from :meth:`~airflow_shared_stream.pubsub.hook.PubSubSharedStreamHook.aget_client_config`.
    :param gcp_conn_id: named in error messages (never the credentials).
    :param rpc_timeout: the longest one call (with its retries) may take before it fails; an
        endpoint that does not answer fails the stream after this long with a clear error.
    """

    def __init__(self, config: PubSubClientConfig, *, gcp_conn_id: str, rpc_timeout: float = 30.0) -> None:
        self._config = config
        self._gcp_conn_id = gcp_conn_id
        self._rpc_timeout = rpc_timeout
        self._subscriber: Any = None
        self._calls: SubscriberCalls | None = None
        self._publisher: Any = None
        self.scrubber = SecretScrubber(config.secrets)
        """Key material of the connection, kept out of error messages and of Google's SDK logs."""

    @property
    def endpoint(self) -> str:
        return self._config.emulator_host or "pubsub.googleapis.com"

    # -- lifecycle ------------------------------------------------------------------------------

    def open(self) -> None:
        """Create the subscriber client. Call from the event loop that will use it."""
        self.scrubber.install("google.api_core", "google.auth", "google.pubsub_v1", "grpc")
        from google.pubsub_v1 import SubscriberAsyncClient
        from google.pubsub_v1.services.subscriber.transports import SubscriberGrpcAsyncIOTransport

        if self._config.emulator_host:
            self._subscriber = SubscriberAsyncClient(
                transport=emulator_transport(SubscriberGrpcAsyncIOTransport, self._config.emulator_host)
            )
        else:
            self._subscriber = SubscriberAsyncClient(credentials=self._config.credentials)
        self._calls = SubscriberCalls.on(self._subscriber.transport.grpc_channel)

    @property
    def calls(self) -> SubscriberCalls:
        if self._calls is None:
            raise RuntimeError("the Pub/Sub client is not open")
        return self._calls

    def _publisher_client(self) -> Any:
        if self._publisher is None:
            from google.pubsub_v1 import PublisherAsyncClient
            from google.pubsub_v1.services.publisher.transports import PublisherGrpcAsyncIOTransport

            if self._config.emulator_host:
                self._publisher = PublisherAsyncClient(
                    transport=emulator_transport(PublisherGrpcAsyncIOTransport, self._config.emulator_host)
                )
            else:
                self._publisher = PublisherAsyncClient(credentials=self._config.credentials)
        return self._publisher

    async def close(self) -> None:
        for client in (self._subscriber, self._publisher):
            if client is not None:
                try:
                    await client.transport.close()
                except Exception as exc:  # best effort: the stream is going away anyway
                    log.debug("Closing a Pub/Sub client failed: %s", type(exc).__name__)
        self._subscriber = self._publisher = self._calls = None

    # -- calls ----------------------------------------------------------------------------------

    def _retry(self) -> Any:
        from google.api_core import exceptions, retry_async

        return retry_async.AsyncRetry(
            initial=0.2,
            maximum=5.0,
            multiplier=2.0,
            predicate=retry_async.if_exception_type(
                exceptions.ServiceUnavailable,
                exceptions.Aborted,
                exceptions.InternalServerError,
                exceptions.Unknown,
            ),
            timeout=self._rpc_timeout,
        )

    async def get_subscription(self, subscription: str) -> Any:
        try:
            return await self._subscriber.get_subscription(
                subscription=subscription, retry=self._retry(), timeout=self._rpc_timeout
            )
        except Exception as exc:
            raise self.explain(exc, "GetSubscription", subscription) from None

    async def get_topic(self, topic: str) -> Any:
        try:
            return await self._publisher_client().get_topic(
                topic=topic, retry=self._retry(), timeout=self._rpc_timeout
            )
        except Exception as exc:
            raise self.explain(exc, "GetTopic", topic) from None

    async def pull(self, subscription: str, max_messages: int, wait_seconds: float) -> Sequence[Any]:
        """
        One unary pull for at most ``max_messages``; an empty list if none came in ``wait_seconds``.

        Pub/Sub holds a pull open until messages are available or the call's deadline passes, so
        ``wait_seconds`` is a long-poll wait, not a sleep.

        Returns the raw protobuf ``ReceivedMessage`` objects (``google.pubsub_v1.types.pubsub_pb2``),
        not proto-plus wrappers: every field read through proto-plus is marshalled anew, which
        cost more than the rest of the stream's path per message; the raw messages read at C speed.
        """
        calls = self.calls
        try:
            response = await calls.pull(
                calls.pull_request(subscription=subscription, max_messages=min(max_messages, PULL_LIMIT)),
                timeout=wait_seconds,
                metadata=calls.pull_metadata(subscription),
            )
        except Exception as exc:
            from google.api_core import exceptions
            from grpc import RpcError

            if isinstance(exc, RpcError):
                exc = exceptions.from_grpc_error(exc)
            if isinstance(exc, exceptions.DeadlineExceeded):
                return []
            raise self.explain(exc, "Pull", subscription) from None
        return list(response.received_messages)

    async def acknowledge(self, subscription: str, ack_ids: Sequence[str]) -> set[str]:
        """
        Acknowledge ``ack_ids``; return those Pub/Sub refused for good (see :meth:`_settle_in_chunks`).

        A refused acknowledgement is a message Pub/Sub hands out again (its lease had run out):
        at-least-once allows that, so it is logged, and the stream goes on.
        """
        calls = self.calls
        refused = await self._settle_in_chunks(
            calls.acknowledge, calls.acknowledge_request, "Acknowledge", subscription, ack_ids
        )
        if refused:
            log.warning(
                "Pub/Sub refused %d acknowledgement(s) on %s (exactly-once delivery: their ack "
                "deadline had passed); it hands those messages out again",
                len(refused),
                subscription,
            )
        return refused

    async def modify_ack_deadline(self, subscription: str, ack_ids: Sequence[str], seconds: int) -> set[str]:
        """
        Set the ack deadline of ``ack_ids`` to ``seconds`` from now (0: redeliver at once).

        Returns the ack ids Pub/Sub refused for good: their lease is lost.
        """
        calls = self.calls
        return await self._settle_in_chunks(
            calls.modify_ack_deadline,
            calls.modify_ack_deadline_request,
            "ModifyAckDeadline",
            subscription,
            ack_ids,
            ack_deadline_seconds=max(0, min(MAX_ACK_DEADLINE_SECONDS, int(seconds))),
        )

    async def _settle_in_chunks(
        self,
        call: Any,
        request_class: Any,
        operation: str,
        subscription: str,
        ack_ids: Sequence[str],
        **fields: Any,
    ) -> set[str]:
        """
        ``Acknowledge`` or ``ModifyAckDeadline`` (``call``), one per ``ACK_IDS_PER_CALL`` ack ids.

        On a subscription with exactly-once delivery Pub/Sub fails the whole call when some of its
        ack ids cannot be settled, and names each of them in the error's ``ErrorInfo`` metadata
        (:func:`ack_id_failures`): ``PERMANENT_FAILURE_INVALID_ACK_ID`` for an ack id whose
        deadline passed, ``TRANSIENT_FAILURE_...`` for one worth sending again. Raised, that failed
        the stream over one expired lease, and the stream's restart left every other message of
        the call to come back too. Instead the transient ones are sent again (a few times), the
        permanent ones are returned, and the ack ids the error does not name were settled. Any
        other failure raises.
        """
        routing = self.calls.routing(subscription)
        refused: set[str] = set()
        for start in range(0, len(ack_ids), ACK_IDS_PER_CALL):
            pending = list(ack_ids[start : start + ACK_IDS_PER_CALL])
            for attempt in range(ACK_ID_RETRIES + 1):
                request = request_class(subscription=subscription, ack_ids=pending, **fields)
                try:
                    await call(request, retry=self._retry(), timeout=self._rpc_timeout, metadata=routing)
                    break
                except Exception as exc:
                    failures = ack_id_failures(exc, pending)
                    if not failures:
                        raise self.explain(exc, operation, subscription) from None
                    transient = [a for a in pending if failures.get(a, "").startswith("TRANSIENT_")]
                    refused.update(a for a in failures if a not in transient)
                    if transient and attempt == ACK_ID_RETRIES:
                        raise self.explain(exc, operation, subscription) from None
                    pending = transient
                if not pending:
                    break
                await asyncio.sleep(ACK_ID_RETRY_SECONDS * 2**attempt)
        return refused

    async def publish(self, topic: str, messages: Sequence[Any]) -> list[str]:
        """Publish ``PubsubMessage`` objects (proto-plus or raw protobuf) in one request; return their ids."""
        from google.pubsub_v1 import PubsubMessage

        wrapped = [m if isinstance(m, PubsubMessage) else PubsubMessage.wrap(m) for m in messages]
        try:
            response = await self._publisher_client().publish(
                topic=topic, messages=wrapped, retry=self._retry(), timeout=self._rpc_timeout
            )
        except Exception as exc:
            raise self.explain(exc, "Publish", topic) from None
        return list(response.message_ids)

    # -- errors ---------------------------------------------------------------------------------

    def explain(self, exc: BaseException, operation: str, resource: str) -> PubSubSharedStreamError:
        """Turn a google.api_core / google.auth error into one of ours (:func:`.errors.explain`)."""
        return explain(
            exc,
            operation,
            resource,
            conn_id=self._gcp_conn_id,
            endpoint=self.endpoint,
            emulator=bool(self._config.emulator_host),
            rpc_timeout=self._rpc_timeout,
            scrubber=self.scrubber,
        )


def ack_id_failures(exc: BaseException, ack_ids: Collection[str]) -> dict[str, str]:
    """
    The ack ids of ``ack_ids`` a failed ``Acknowledge`` / ``ModifyAckDeadline`` names, with why.

    Pub/Sub reports them on subscriptions with exactly-once delivery, as the metadata of an
    ``ErrorInfo`` detail of the call's status (google-cloud-pubsub's streaming pull manager reads
    them the same way). Empty for any other error.
    """
    from google.api_core import exceptions

    if isinstance(exc, exceptions.RetryError):
        exc = exc.cause or exc
    metadata = exc.metadata if isinstance(exc, exceptions.GoogleAPICallError) else None
    if not metadata:
        return {}
    named = set(ack_ids)
    return {
        ack_id: str(why)
        for ack_id, why in metadata.items()
        if ack_id in named and str(why).startswith(("PERMANENT_", "TRANSIENT_"))
    }


def emulator_transport(transport_class: Any, host: str) -> Any:
    """
    A GAPIC asyncio transport to the emulator at ``host``: plain gRPC, no credentials.

    The transport builds the channel itself, through the callable it is given, with the options it
    gives a production channel (no send or receive size limit, keepalive): a channel built with
    gRPC's defaults refuses any response over 4 MiB, and one pull of large messages is more than
    that (100 messages of 48 KB failed every pull with ResourceExhausted).
    """
    import grpc
    from google.auth.credentials import AnonymousCredentials

    def insecure_channel(target: str, *, options: Sequence[tuple[str, Any]] = (), **_: Any) -> Any:
        return grpc.aio.insecure_channel(target, options=list(options))

    return transport_class(host=host, credentials=AnonymousCredentials(), channel=insecure_channel)


@dataclass(frozen=True)
class SubscriberCalls:
    """
    ``Pull``, ``Acknowledge`` and ``ModifyAckDeadline`` on raw protobuf messages.

    Why not the generated ``SubscriberAsyncClient`` methods: each builds a proto-plus request
    (``ack_ids`` extended one id at a time in Python), reads its fields back through proto-plus
    for the routing header, wraps the response again, and runs api_core's retry, timeout and
    tracing wrappers: CPU of the triggerer's one event loop on every call (docs/benchmarks.rst,
    Pub/Sub).

    The stubs sit on the generated client's own channel (its credentials, its TLS) and send the
    metadata its methods send: the client header and the routing header, built once per
    subscription. ``Acknowledge`` and ``ModifyAckDeadline`` keep api_core's ``wrap_method``
    (the error mapping to ``google.api_core.exceptions`` and the retry the client asks for);
    ``Pull``, made with no retry (a long poll that times out is an empty pull), calls its stub
    bare and maps a failure with ``google.api_core.exceptions.from_grpc_error``
    (:meth:`PubSubClient.pull`).
    """

    pull: Any
    acknowledge: Any
    modify_ack_deadline: Any
    pull_request: Any
    """The raw protobuf ``PullRequest`` class (``google.pubsub_v1.types.PullRequest.pb()``)."""
    acknowledge_request: Any
    modify_ack_deadline_request: Any
    client_metadata: tuple[str, str]
    """The ``x-goog-api-client`` header of the generated client."""
    _routing: dict[str, tuple[tuple[str, str], ...]]

    @classmethod
    def on(cls, channel: Any) -> SubscriberCalls:
        from google.api_core import gapic_v1
        from google.protobuf import empty_pb2
        from google.pubsub_v1 import types
        from google.pubsub_v1.services.subscriber.transports.base import DEFAULT_CLIENT_INFO

        def stub(method: str, request: Any, response: Any) -> Any:
            return channel.unary_unary(
                f"/google.pubsub.v1.Subscriber/{method}",
                request_serializer=request.SerializeToString,
                response_deserializer=response.FromString,
            )

        def wrapped(method: str, request: Any) -> Any:
            return gapic_v1.method_async.wrap_method(
                stub(method, request, empty_pb2.Empty), client_info=DEFAULT_CLIENT_INFO
            )

        pull_request = types.PullRequest.pb()
        acknowledge_request = types.AcknowledgeRequest.pb()
        modify_ack_deadline_request = types.ModifyAckDeadlineRequest.pb()
        return cls(
            pull=stub("Pull", pull_request, types.PullResponse.pb()),
            acknowledge=wrapped("Acknowledge", acknowledge_request),
            modify_ack_deadline=wrapped("ModifyAckDeadline", modify_ack_deadline_request),
            pull_request=pull_request,
            acknowledge_request=acknowledge_request,
            modify_ack_deadline_request=modify_ack_deadline_request,
            client_metadata=DEFAULT_CLIENT_INFO.to_grpc_metadata(),
            _routing={},
        )

    def routing(self, subscription: str) -> tuple[tuple[str, str], ...]:
        """The ``x-goog-request-params`` header the generated methods send, for ``subscription``."""
        header = self._routing.get(subscription)
        if header is None:
            from google.api_core import gapic_v1

            header = (gapic_v1.routing_header.to_grpc_metadata((("subscription", subscription),)),)
            self._routing[subscription] = header
        return header

    def pull_metadata(self, subscription: str) -> tuple[tuple[str, str], ...]:
        """What a bare ``Pull`` sends: the routing header, and the client header ``wrap_method`` adds."""
        return (*self.routing(subscription), self.client_metadata)
