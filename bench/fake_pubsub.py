"""
A Pub/Sub server on loopback that hands out up to 1,000 messages per pull, for one benchmark question.

The question: how much of the one-watcher gap between ours and the manager's ceiling on Pub/Sub
(docs/benchmarks.rst) comes from the emulator's cap of 100 messages per ``Pull``, which makes the
stream pay gRPC's cost per call (about 300 µs of the event loop's CPU on these machines) ten times
per 1,000 messages, where Pub/Sub itself returns up to 1,000 per pull? Google's emulator has no
option for the cap, and there is no Pub/Sub project on these machines, so this server answers the
calls the benchmark makes, with Pub/Sub's own limit, and nothing else. It is NOT a broker to test
against (the integration and reliability suites use Google's emulator): it keeps everything in
memory, has no ack-deadline expiry, no ordering, no dead-letter policy and no auth.

What it serves (``google.pubsub.v1``, raw protobuf messages): ``Publisher.CreateTopic``,
``GetTopic``, ``Publish``; ``Subscriber.CreateSubscription``, ``GetSubscription``, ``Pull`` (up
to ``--pull-cap`` of the messages not outstanding, waiting up to the call's deadline when there
are none, as a pull with ``return_immediately`` unset does), ``Acknowledge`` and
``ModifyAckDeadline`` (0 puts a message back at the head; any other value is accepted and
ignored). ``bench/watchers.py --pubsub-pull-cap 1000`` runs the Pub/Sub cells on it.

Run: ``python -m bench.fake_pubsub --port P [--pull-cap 1000]``.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
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

PUBSUB_PULL_LIMIT = 1000
"""The most messages Pub/Sub returns for one ``Pull`` (its ``max_messages`` limit)."""
LONG_POLL_MARGIN = 0.2
"""An empty pull answers this long before the caller's deadline, so the caller sees an empty
response rather than ``DEADLINE_EXCEEDED`` (either is an empty pull to every client)."""


@dataclass
class Subscription:
    """One subscription's messages: those waiting, in order, and those pulled and not settled."""

    pb: Any
    waiting: collections.deque[Any] = field(default_factory=collections.deque)
    outstanding: dict[str, Any] = field(default_factory=dict)
    arrived: asyncio.Event = field(default_factory=asyncio.Event)


class FakePubSub:
    """The state and the handlers of the calls listed in the module docstring."""

    def __init__(self, pull_cap: int) -> None:
        from google.pubsub_v1 import types

        self.types = types
        self.pull_cap = pull_cap
        self.topics: dict[str, Any] = {}
        self.subscriptions: dict[str, Subscription] = {}
        self.by_topic: dict[str, list[Subscription]] = collections.defaultdict(list)
        self._message_ids = itertools.count(1)
        self._ack_ids = itertools.count(1)

    # -- publisher -----------------------------------------------------------------------------

    async def create_topic(self, topic: Any, context: Any) -> Any:
        self.topics[topic.name] = topic
        return topic

    async def get_topic(self, request: Any, context: Any) -> Any:
        topic = self.topics.get(request.topic)
        if topic is None:
            await abort_not_found(context, request.topic)
        return topic

    async def publish(self, request: Any, context: Any) -> Any:
        types = self.types
        if request.topic not in self.topics:
            await abort_not_found(context, request.topic)
        seconds = int(time.time())
        ids = []
        for message in request.messages:
            stored = types.PubsubMessage.pb()()
            stored.CopyFrom(message)
            stored.message_id = str(next(self._message_ids))
            stored.publish_time.seconds = seconds
            ids.append(stored.message_id)
            for subscription in self.by_topic[request.topic]:
                subscription.waiting.append(stored)
                subscription.arrived.set()
        return types.PublishResponse.pb()(message_ids=ids)

    # -- subscriber ----------------------------------------------------------------------------

    async def create_subscription(self, subscription: Any, context: Any) -> Any:
        if subscription.topic not in self.topics:
            await abort_not_found(context, subscription.topic)
        if not subscription.ack_deadline_seconds:
            subscription.ack_deadline_seconds = 10
        state = Subscription(subscription)
        self.subscriptions[subscription.name] = state
        self.by_topic[subscription.topic].append(state)
        return subscription

    async def get_subscription(self, request: Any, context: Any) -> Any:
        return (await self._subscription(request.subscription, context)).pb

    async def pull(self, request: Any, context: Any) -> Any:
        subscription = await self._subscription(request.subscription, context)
        remaining = context.time_remaining()
        wait = 30.0 if remaining is None else max(0.0, remaining - LONG_POLL_MARGIN)
        if not subscription.waiting:
            subscription.arrived.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(subscription.arrived.wait(), timeout=wait)
        response = self.types.PullResponse.pb()()
        limit = min(request.max_messages or self.pull_cap, self.pull_cap)
        waiting = subscription.waiting
        while waiting and len(response.received_messages) < limit:
            message = waiting.popleft()
            received = response.received_messages.add()
            received.ack_id = f"{request.subscription}:{next(self._ack_ids)}"
            received.message.CopyFrom(message)
            subscription.outstanding[received.ack_id] = message
        return response

    async def acknowledge(self, request: Any, context: Any) -> Any:
        subscription = await self._subscription(request.subscription, context)
        for ack_id in request.ack_ids:
            subscription.outstanding.pop(ack_id, None)
        return self._empty()

    async def modify_ack_deadline(self, request: Any, context: Any) -> Any:
        subscription = await self._subscription(request.subscription, context)
        if request.ack_deadline_seconds == 0:
            back = [subscription.outstanding.pop(a) for a in request.ack_ids if a in subscription.outstanding]
            subscription.waiting.extendleft(reversed(back))
            if back:
                subscription.arrived.set()
        return self._empty()

    # -- helpers -------------------------------------------------------------------------------

    async def _subscription(self, name: str, context: Any) -> Subscription:
        subscription = self.subscriptions.get(name)
        if subscription is None:
            await abort_not_found(context, name)
        assert subscription is not None
        return subscription

    @staticmethod
    def _empty() -> Any:
        from google.protobuf import empty_pb2

        return empty_pb2.Empty()

    def handlers(self) -> list[Any]:
        return pubsub_handlers(self)


async def serve(port: int, pull_cap: int) -> None:
    import grpc

    server = grpc.aio.server(options=[("grpc.so_reuseport", 0)])  # never a port shared with another server
    server.add_generic_rpc_handlers(FakePubSub(pull_cap).handlers())
    server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    print(f"listening on 127.0.0.1:{port}, pull cap {pull_cap}", flush=True)
    await server.wait_for_termination()


@contextlib.contextmanager
def fake_pubsub_process(pull_cap: int = PUBSUB_PULL_LIMIT, *, timeout: float = 30.0) -> Iterator[Any]:
    """Run this server in a process of its own for the block; yields a ``PubSubEmulator`` for it."""
    from tests.support.processes import free_port, running, wait_for_port
    from tests.support.pubsub_emulator import PubSubEmulator

    port = free_port()
    log_path = Path(tempfile.mkdtemp(prefix="bench-fake-pubsub-")) / "fake-pubsub.log"
    argv = [sys.executable, "-m", "bench.fake_pubsub", "--port", str(port), "--pull-cap", str(pull_cap)]
    root = Path(__file__).resolve().parents[1]
    with running(argv, log_path=log_path, cwd=root) as proc:
        wait_for_port(port, timeout, proc, what=f"the fake Pub/Sub server (log: {log_path})")
        yield PubSubEmulator(port=port, log_path=log_path, pid=proc.pid)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--pull-cap", type=int, default=PUBSUB_PULL_LIMIT)
    args = parser.parse_args()
    asyncio.run(serve(args.port, args.pull_cap))


if __name__ == "__main__":
    main()
