"""The gRPC wiring both in-memory Pub/Sub servers share (tests/support/pubsub_service.py, bench/)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

CALLS: dict[str, tuple[str, str, str, str]] = {
    # RPC name: (service, method of the server object, request type, response type)
    "CreateTopic": ("Publisher", "create_topic", "Topic", "Topic"),
    "GetTopic": ("Publisher", "get_topic", "GetTopicRequest", "Topic"),
    "DeleteTopic": ("Publisher", "delete_topic", "DeleteTopicRequest", "Empty"),
    "Publish": ("Publisher", "publish", "PublishRequest", "PublishResponse"),
    "CreateSubscription": ("Subscriber", "create_subscription", "Subscription", "Subscription"),
    "GetSubscription": ("Subscriber", "get_subscription", "GetSubscriptionRequest", "Subscription"),
    "Pull": ("Subscriber", "pull", "PullRequest", "PullResponse"),
    "Acknowledge": ("Subscriber", "acknowledge", "AcknowledgeRequest", "Empty"),
    "ModifyAckDeadline": ("Subscriber", "modify_ack_deadline", "ModifyAckDeadlineRequest", "Empty"),
}
"""The ``google.pubsub.v1`` calls a server answers when it has the method named here."""


def pubsub_handlers(
    server: object, extra: dict[str, dict[str, Callable[..., Any]]] | None = None
) -> list[Any]:
    """
    gRPC handlers for every call of :data:`CALLS` that ``server`` has a method for.

    ``extra`` adds services of the server's own (service name: RPC name: raw handler).
    """
    import grpc
    from google.protobuf import empty_pb2
    from google.pubsub_v1 import types

    def message_class(name: str) -> Any:
        return empty_pb2.Empty if name == "Empty" else getattr(types, name).pb()

    services: dict[str, dict[str, Any]] = {"Publisher": {}, "Subscriber": {}}
    for rpc, (service, method, request, response) in CALLS.items():
        handler = getattr(server, method, None)
        if handler is None:
            continue
        services[service][rpc] = grpc.unary_unary_rpc_method_handler(
            handler,
            request_deserializer=message_class(request).FromString,
            response_serializer=message_class(response).SerializeToString,
        )
    handlers = [grpc.method_handlers_generic_handler(f"google.pubsub.v1.{s}", m) for s, m in services.items()]
    for service, methods in (extra or {}).items():
        handlers.append(
            grpc.method_handlers_generic_handler(
                service, {rpc: grpc.unary_unary_rpc_method_handler(h) for rpc, h in methods.items()}
            )
        )
    return handlers


async def abort_not_found(context: Any, resource: str) -> None:
    """Answer as Pub/Sub does for a topic or subscription that does not exist."""
    import grpc

    await context.abort(grpc.StatusCode.NOT_FOUND, f"Resource not found (resource={resource}).")
