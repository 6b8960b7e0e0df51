"""
The stream's raw ``Pull`` / ``Acknowledge`` / ``ModifyAckDeadline`` stubs send what the generated
client sends.

``PubSubClient`` calls these three on raw protobuf stubs instead of ``SubscriberAsyncClient``'s
methods (pubsub/client.py says why). A server that records every call it gets (a real gRPC
server on loopback, in this process) takes the same three calls from the generated client and
from ours: the method paths, the request bytes and the ``x-goog-*`` metadata (the client header
and the routing header Pub/Sub routes by) must be the same, so nothing the service relies on is
lost by leaving the generated methods.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest
from google.protobuf import empty_pb2
from google.pubsub_v1 import types

from airflow_shared_stream.pubsub.client import PubSubClient
from airflow_shared_stream.pubsub.errors import PubSubConfigurationError, PubSubNotFoundError
from airflow_shared_stream.pubsub.hook import PubSubClientConfig

SUBSCRIPTION = "projects/shop-prod-1/subscriptions/orders"


class RecordingServer(grpc.GenericRpcHandler):
    """Answers every unary call with an empty response and records what came."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, bytes, list[tuple[str, str]]]] = []
        self.refuse_pulls = False
        self.ack_id_failures: list[dict[str, str]] = []
        """Per ``Acknowledge`` / ``ModifyAckDeadline`` call, in order: the ack ids to fail, as
        Pub/Sub fails them on a subscription with exactly-once delivery."""

    def service(self, handler_call_details: Any) -> Any:
        method = handler_call_details.method
        metadata = sorted(
            (key, value)
            for key, value in handler_call_details.invocation_metadata
            if key.startswith("x-goog")
        )

        async def answer(request: bytes, context: Any) -> bytes:
            self.calls.append((method, request, metadata))
            if method.endswith("/Pull"):
                if self.refuse_pulls:
                    await context.abort(grpc.StatusCode.NOT_FOUND, "Resource not found (resource=orders).")
                return types.PullResponse.pb()().SerializeToString()
            if self.ack_id_failures:
                failures = self.ack_id_failures.pop(0)
                if failures:
                    await abort_like_exactly_once_delivery(context, failures)
            return empty_pb2.Empty().SerializeToString()

        return grpc.unary_unary_rpc_method_handler(answer)


async def abort_like_exactly_once_delivery(context: Any, failures: dict[str, str]) -> None:
    """
    Fail the call as Pub/Sub does when ack ids of an exactly-once subscription cannot be settled.

    The status carries an ``ErrorInfo`` detail whose metadata maps each failed ack id to why
    (``PERMANENT_FAILURE_INVALID_ACK_ID``, ``TRANSIENT_FAILURE_...``), in the
    ``grpc-status-details-bin`` trailer, which is where google-cloud-pubsub reads it.
    """
    from google.protobuf import any_pb2
    from google.rpc import code_pb2, error_details_pb2, status_pb2

    info = error_details_pb2.ErrorInfo(
        reason="EXACTLY_ONCE_ACKID_FAILURE", domain="pubsub.googleapis.com", metadata=failures
    )
    detail = any_pb2.Any()
    detail.Pack(info)
    message = "Some acknowledgement ids in the request were invalid."
    status = status_pb2.Status(code=code_pb2.INVALID_ARGUMENT, message=message, details=[detail])
    await context.abort(
        grpc.StatusCode.INVALID_ARGUMENT,
        message,
        trailing_metadata=(("grpc-status-details-bin", status.SerializeToString()),),
    )


@pytest.fixture
async def server() -> AsyncIterator[tuple[RecordingServer, str]]:
    recording = RecordingServer()
    grpc_server = grpc.aio.server(options=[("grpc.so_reuseport", 0)])  # a port of its own, never shared
    grpc_server.add_generic_rpc_handlers((recording,))
    port = grpc_server.add_insecure_port("127.0.0.1:0")
    await grpc_server.start()
    try:
        yield recording, f"127.0.0.1:{port}"
    finally:
        await grpc_server.stop(None)


async def test_our_stubs_send_the_generated_clients_paths_requests_and_headers(server):
    recording, address = server
    from google.pubsub_v1 import SubscriberAsyncClient
    from google.pubsub_v1.services.subscriber.transports import SubscriberGrpcAsyncIOTransport

    generated = SubscriberAsyncClient(
        transport=SubscriberGrpcAsyncIOTransport(channel=grpc.aio.insecure_channel(address))
    )
    try:
        await generated.pull(subscription=SUBSCRIPTION, max_messages=100)
        await generated.acknowledge(subscription=SUBSCRIPTION, ack_ids=["a1", "a2"])
        await generated.modify_ack_deadline(
            subscription=SUBSCRIPTION, ack_ids=["a1"], ack_deadline_seconds=30
        )
    finally:
        await generated.transport.close()
    theirs, recording.calls = recording.calls, []

    ours = PubSubClient(
        PubSubClientConfig(project="shop-prod-1", emulator_host=address, credentials_source="emulator"),
        gcp_conn_id="google_cloud_default",
    )
    ours.open()
    try:
        assert await ours.pull(SUBSCRIPTION, 100, wait_seconds=5.0) == []
        await ours.acknowledge(SUBSCRIPTION, ["a1", "a2"])
        await ours.modify_ack_deadline(SUBSCRIPTION, ["a1"], 30)
    finally:
        await ours.close()

    assert [call[0] for call in theirs] == [
        "/google.pubsub.v1.Subscriber/Pull",
        "/google.pubsub.v1.Subscriber/Acknowledge",
        "/google.pubsub.v1.Subscriber/ModifyAckDeadline",
    ]
    assert recording.calls == theirs
    assert ("x-goog-request-params", f"subscription={SUBSCRIPTION}") in recording.calls[0][2]
    assert any(key == "x-goog-api-client" for key, _ in recording.calls[0][2])


async def test_a_refused_pull_reads_as_before(server):
    """A gRPC status on the bare ``Pull`` stub becomes the same error of ours the generated call gave."""
    recording, address = server
    recording.refuse_pulls = True
    ours = PubSubClient(
        PubSubClientConfig(project="shop-prod-1", emulator_host=address, credentials_source="emulator"),
        gcp_conn_id="google_cloud_default",
    )
    ours.open()
    try:
        with pytest.raises(PubSubNotFoundError, match="subscription does not exist") as caught:
            await ours.pull(SUBSCRIPTION, 100, wait_seconds=5.0)
    finally:
        await ours.close()
    assert SUBSCRIPTION in str(caught.value)
    assert "google_cloud_default" in str(caught.value)


def acked_ids(call: tuple[str, bytes, list[tuple[str, str]]]) -> list[str]:
    request_class = (
        types.AcknowledgeRequest if call[0].endswith("/Acknowledge") else types.ModifyAckDeadlineRequest
    )
    return list(request_class.pb().FromString(call[1]).ack_ids)


async def test_ack_ids_refused_for_good_on_an_exactly_once_subscription_do_not_fail_the_call(server):
    """
    Exactly-once delivery: an ack id whose deadline passed fails the whole call, naming that id.

    Google's emulator accepts any ack id even on such a subscription, so a server that answers as
    Pub/Sub does stands in for it here. Raised, the failure failed the stream (and every other
    message of the call came back with its restart); now the refused ids are returned (their
    messages come back: at-least-once) and the others count as settled, not sent again.
    """
    recording, address = server
    recording.ack_id_failures = [
        {"a2": "PERMANENT_FAILURE_INVALID_ACK_ID"},
        {"a1": "PERMANENT_FAILURE_INVALID_ACK_ID"},
    ]
    ours = PubSubClient(
        PubSubClientConfig(project="shop-prod-1", emulator_host=address, credentials_source="emulator"),
        gcp_conn_id="google_cloud_default",
    )
    ours.open()
    try:
        assert await ours.acknowledge(SUBSCRIPTION, ["a1", "a2", "a3"]) == {"a2"}
        assert await ours.modify_ack_deadline(SUBSCRIPTION, ["a1", "a3"], 30) == {"a1"}
    finally:
        await ours.close()
    assert [acked_ids(call) for call in recording.calls] == [["a1", "a2", "a3"], ["a1", "a3"]]


async def test_ack_ids_refused_for_now_are_sent_again_alone(server):
    recording, address = server
    recording.ack_id_failures = [{"a2": "TRANSIENT_FAILURE_UNORDERED_ACK_ID"}, {}]
    ours = PubSubClient(
        PubSubClientConfig(project="shop-prod-1", emulator_host=address, credentials_source="emulator"),
        gcp_conn_id="google_cloud_default",
    )
    ours.open()
    try:
        assert await ours.acknowledge(SUBSCRIPTION, ["a1", "a2", "a3"]) == set()
    finally:
        await ours.close()
    assert [acked_ids(call) for call in recording.calls] == [["a1", "a2", "a3"], ["a2"]]


async def test_a_refused_settlement_that_names_no_ack_id_still_fails_clearly(server):
    recording, address = server
    recording.ack_id_failures = [{"unrelated-id": "PERMANENT_FAILURE_INVALID_ACK_ID"}]
    ours = PubSubClient(
        PubSubClientConfig(project="shop-prod-1", emulator_host=address, credentials_source="emulator"),
        gcp_conn_id="google_cloud_default",
    )
    ours.open()
    try:
        with pytest.raises(PubSubConfigurationError, match=r"Acknowledge on .* was refused"):
            await ours.acknowledge(SUBSCRIPTION, ["a1"])
    finally:
        await ours.close()
