"""
A Pub/Sub stand-in on loopback that behaves as the service documents where Google's emulator does not.

FIDELITY.md lists where the emulator differs from Pub/Sub on what our guarantees rest on:

* "Pub/Sub ordering key after a nack": the emulator redelivers the nacked head after later
  messages and then stalls the key for tens of seconds; the service hands the nacked message
  and the later ones of its key out again at once, in order (Pub/Sub's ordering docs: "when
  Pub/Sub redelivers a message with an ordering key, it also redelivers every subsequent message
  with the same ordering key"). So a stream that nacks a key every round spends a dead-letter
  policy's attempts in seconds here, as on the service.
* "Pub/Sub exactly-once": the emulator accepts any ack id; the service, on a subscription with
  exactly-once delivery, fails an ``Acknowledge`` / ``ModifyAckDeadline`` naming an ack id whose
  deadline passed, with ``PERMANENT_FAILURE_INVALID_ACK_ID`` in the status's ``ErrorInfo``.

Everything else follows the service's documented behaviour as far as the tests use it: delivery
attempts counted per delivery on a subscription with a dead-letter policy, and past
``max_delivery_attempts`` the message forwarded to the policy's topic; ack deadlines that lapse;
``modifyAckDeadline 0`` redelivers at once. It serves the calls of the producer and of
:class:`~tests.support.pubsub_emulator.PubSubEmulator`'s helpers, keeps everything in memory, and
has one call of its own, ``standin.Control/ExpireLeases`` (the leases of a subscription lapse now:
what a stalled renewal does on the service, without waiting for a deadline).

Run: ``python -m tests.support.pubsub_service --port P``; tests use :func:`pubsub_service_process`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.support.pubsub_grpc import abort_not_found, pubsub_handlers

LONG_POLL_MARGIN = 0.2
"""An empty pull answers this long before the caller's deadline (an empty response, not an error)."""
EXPIRE_CONTROL = "/standin.Control/ExpireLeases"


@dataclass
class Entry:
    """One message on one subscription, until it is acknowledged or forwarded."""

    message: Any
    attempts: int = 0
    ack_id: str | None = None
    """The ack id of its current delivery (``None``: waiting to be delivered)."""
    deadline: float = 0.0


@dataclass
class Subscription:
    pb: Any
    entries: list[Entry] = field(default_factory=list)
    """Every message not yet acknowledged, in publish order."""
    expired_ack_ids: set[str] = field(default_factory=set)
    changed: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def ordered(self) -> bool:
        return bool(self.pb.enable_message_ordering)

    @property
    def exactly_once(self) -> bool:
        return bool(self.pb.enable_exactly_once_delivery)


class PubSubService:
    """The state and the handlers of the calls listed in the module docstring."""

    def __init__(self) -> None:
        from google.pubsub_v1 import types

        self.types = types
        self.topics: dict[str, Any] = {}
        self.subscriptions: dict[str, Subscription] = {}
        self._message_ids = itertools.count(1)
        self._ack_ids = itertools.count(1)

    # -- publisher -----------------------------------------------------------------------------

    async def create_topic(self, topic: Any, context: Any) -> Any:
        self.topics[topic.name] = topic
        return topic

    async def get_topic(self, request: Any, context: Any) -> Any:
        await self._exists(self.topics, request.topic, context)
        return self.topics[request.topic]

    async def delete_topic(self, request: Any, context: Any) -> Any:
        await self._exists(self.topics, request.topic, context)
        del self.topics[request.topic]
        return _empty()

    async def publish(self, request: Any, context: Any) -> Any:
        await self._exists(self.topics, request.topic, context)
        return self.types.PublishResponse.pb()(message_ids=self._publish(request.topic, request.messages))

    def _publish(self, topic: str, messages: Any) -> list[str]:
        ids = []
        now = time.time()
        for message in messages:
            stored = self.types.PubsubMessage.pb()()
            stored.CopyFrom(message)
            stored.message_id = str(next(self._message_ids))
            stored.publish_time.seconds = int(now)
            stored.publish_time.nanos = int((now % 1) * 1e9)
            ids.append(stored.message_id)
            for subscription in self.subscriptions.values():
                if subscription.pb.topic == topic:
                    subscription.entries.append(Entry(stored))
                    subscription.changed.set()
        return ids

    # -- subscriber ----------------------------------------------------------------------------

    async def create_subscription(self, subscription: Any, context: Any) -> Any:
        await self._exists(self.topics, subscription.topic, context)
        if not subscription.ack_deadline_seconds:
            subscription.ack_deadline_seconds = 10
        self.subscriptions[subscription.name] = Subscription(subscription)
        return subscription

    async def get_subscription(self, request: Any, context: Any) -> Any:
        await self._exists(self.subscriptions, request.subscription, context)
        return self.subscriptions[request.subscription].pb

    async def pull(self, request: Any, context: Any) -> Any:
        await self._exists(self.subscriptions, request.subscription, context)
        subscription = self.subscriptions[request.subscription]
        remaining = context.time_remaining()
        give_up = time.monotonic() + (30.0 if remaining is None else max(0.0, remaining - LONG_POLL_MARGIN))
        response = self.types.PullResponse.pb()()
        while True:
            self._expire(subscription)
            self._deliver(subscription, request.max_messages or 1000, response)
            left = give_up - time.monotonic()
            if response.received_messages or left <= 0:
                return response
            subscription.changed.clear()
            with contextlib.suppress(TimeoutError):  # woken by a publish or a nack; deadlines lapse
                await asyncio.wait_for(subscription.changed.wait(), timeout=min(left, 0.2))

    def _deliver(self, subscription: Subscription, limit: int, response: Any) -> None:
        policy = subscription.pb.dead_letter_policy
        now = time.monotonic()
        for entry in list(subscription.entries):
            if len(response.received_messages) >= limit:
                return
            if entry.ack_id is not None:
                continue
            if policy.dead_letter_topic and entry.attempts >= (policy.max_delivery_attempts or 5):
                subscription.entries.remove(entry)  # forwarded: gone from the subscription
                if policy.dead_letter_topic in self.topics:
                    self._publish(policy.dead_letter_topic, [entry.message])
                continue
            entry.attempts += 1
            entry.ack_id = f"{subscription.pb.name}:{next(self._ack_ids)}"
            entry.deadline = now + subscription.pb.ack_deadline_seconds
            received = response.received_messages.add()
            received.ack_id = entry.ack_id
            received.message.CopyFrom(entry.message)
            if policy.dead_letter_topic:
                received.delivery_attempt = entry.attempts

    def _expire(self, subscription: Subscription, everything: bool = False) -> None:
        now = time.monotonic()
        for entry in subscription.entries:
            if entry.ack_id is not None and (everything or entry.deadline <= now):
                self._redeliver(subscription, entry)

    def _redeliver(self, subscription: Subscription, entry: Entry) -> None:
        """Hand ``entry`` out again at once; on an ordered subscription, the later ones of its key too."""
        key = entry.message.ordering_key
        later = subscription.entries[subscription.entries.index(entry) :]
        for other in later if subscription.ordered and key else [entry]:
            if other.ack_id is not None and (other is entry or other.message.ordering_key == key):
                subscription.expired_ack_ids.add(other.ack_id)
                other.ack_id = None
        subscription.changed.set()

    def _current(self, subscription: Subscription, ack_ids: Any) -> tuple[list[Entry], dict[str, str]]:
        by_ack_id = {e.ack_id: e for e in subscription.entries if e.ack_id is not None}
        found = [by_ack_id[a] for a in ack_ids if a in by_ack_id]
        refused = {
            a: "PERMANENT_FAILURE_INVALID_ACK_ID"
            for a in ack_ids
            if a not in by_ack_id and subscription.exactly_once
        }
        return found, refused

    async def acknowledge(self, request: Any, context: Any) -> Any:
        await self._exists(self.subscriptions, request.subscription, context)
        subscription = self.subscriptions[request.subscription]
        self._expire(subscription)
        found, refused = self._current(subscription, request.ack_ids)
        for entry in found:
            subscription.entries.remove(entry)
        await self._refuse(refused, context)
        return _empty()

    async def modify_ack_deadline(self, request: Any, context: Any) -> Any:
        await self._exists(self.subscriptions, request.subscription, context)
        subscription = self.subscriptions[request.subscription]
        self._expire(subscription)
        found, refused = self._current(subscription, request.ack_ids)
        for entry in found:
            if request.ack_deadline_seconds == 0:
                if entry.ack_id is not None:  # not already back with an earlier one of its key
                    self._redeliver(subscription, entry)
            else:
                entry.deadline = time.monotonic() + request.ack_deadline_seconds
        await self._refuse(refused, context)
        return _empty()

    async def expire_leases(self, request: bytes, context: Any) -> bytes:
        """``standin.Control/ExpireLeases``: the body is a subscription path; its leases lapse now."""
        self._expire(self.subscriptions[request.decode()], everything=True)
        return b""

    # -- helpers -------------------------------------------------------------------------------

    @staticmethod
    async def _refuse(refused: dict[str, str], context: Any) -> None:
        """Fail the call as the service does on exactly-once: ``ErrorInfo`` naming each ack id."""
        if not refused:
            return
        import grpc
        from google.protobuf import any_pb2
        from google.rpc import code_pb2, error_details_pb2, status_pb2
        from grpc_status import rpc_status

        info = error_details_pb2.ErrorInfo(reason="EXACTLY_ONCE_ACKID_FAILURE", metadata=refused)
        detail = any_pb2.Any()
        detail.Pack(info)
        status = status_pb2.Status(
            code=code_pb2.INVALID_ARGUMENT,
            message="Some acknowledgement ids in the request were invalid.",
            details=[detail],
        )
        converted = rpc_status.to_status(status)
        assert converted.code is grpc.StatusCode.INVALID_ARGUMENT
        await context.abort(converted.code, converted.details, converted.trailing_metadata)

    @staticmethod
    async def _exists(table: dict[str, Any], name: str, context: Any) -> None:
        if name not in table:
            await abort_not_found(context, name)

    def handlers(self) -> list[Any]:
        return pubsub_handlers(self, extra={"standin.Control": {"ExpireLeases": self.expire_leases}})


def _empty() -> Any:
    from google.protobuf import empty_pb2

    return empty_pb2.Empty()


def expire_leases(host: str, subscription: str) -> None:
    """Make every lease of ``subscription`` on the stand-in at ``host`` lapse now."""
    import grpc

    with grpc.insecure_channel(host) as channel:
        channel.unary_unary(EXPIRE_CONTROL)(subscription.encode(), timeout=10)


async def serve(port: int) -> None:
    import grpc

    # gRPC's C core sets SO_REUSEPORT on its listeners: two servers on one port would share its
    # connections between them. Off, a port another process holds fails the bind here, loudly.
    server = grpc.aio.server(options=[("grpc.so_reuseport", 0)])
    server.add_generic_rpc_handlers(PubSubService().handlers())
    server.add_insecure_port(f"127.0.0.1:{port}")  # raises when it cannot bind
    await server.start()
    print(f"listening on 127.0.0.1:{port}", flush=True)
    await server.wait_for_termination()


@contextlib.contextmanager
def pubsub_service_process(*, timeout: float = 30.0) -> Iterator[Any]:
    """Run the stand-in in a process of its own for the block; yields a ``PubSubEmulator`` for it."""
    from tests.support.processes import free_port, running, wait_for_port
    from tests.support.pubsub_emulator import PubSubEmulator

    port = free_port()
    log_path = Path(tempfile.mkdtemp(prefix="pubsub-service-")) / "pubsub-service.log"
    argv = [sys.executable, "-m", "tests.support.pubsub_service", "--port", str(port)]
    root = Path(__file__).resolve().parents[2]
    with running(argv, log_path=log_path, cwd=root) as proc:
        wait_for_port(port, timeout, proc, what=f"the Pub/Sub stand-in (log: {log_path})")
        yield PubSubEmulator(port=port, log_path=log_path, pid=proc.pid)


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--port", type=int, required=True)
    asyncio.run(serve(parser.parse_args().port))


if __name__ == "__main__":
    main()
