"""bench/watchers.py on Pub/Sub: Google's emulator (or bench/fake_pubsub.py), RPCs counted at gRPC."""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.ceilings import run_ceiling, run_template
from bench.harness import Cell, Meter, drive_shared, hold_in_flight, rss_kib, run_pollers


class RpcCounter:
    """
    Count the Pub/Sub RPCs every variant makes, at gRPC's asyncio channel.

    Ours (which calls its hot path on raw stubs, pubsub/client.py), the bare loop and google's
    trigger (through ``SubscriberAsyncClient``) all go through ``grpc.aio``'s multicallables: one
    call there is one RPC, a retry included. A new client is counted too (``client``): google's
    trigger builds one, with its own gRPC channel and connection, each time it runs.
    """

    METHODS = {
        "/google.pubsub.v1.Subscriber/Pull": "pull",
        "/google.pubsub.v1.Subscriber/Acknowledge": "acknowledge",
        "/google.pubsub.v1.Subscriber/ModifyAckDeadline": "modify_ack_deadline",
        "/google.pubsub.v1.Subscriber/StreamingPull": "streaming_pull",
    }

    def __init__(self) -> None:
        self._counts: collections.Counter[str] = collections.Counter()
        self._saved: list[tuple[Any, str, Any]] = []

    def install(self) -> None:
        from google.pubsub_v1 import SubscriberAsyncClient
        from grpc.aio import _channel

        counts, methods = self._counts, self.METHODS
        for multicallable in (_channel.UnaryUnaryMultiCallable, _channel.StreamStreamMultiCallable):
            original = multicallable.__call__
            self._saved.append((multicallable, "__call__", original))

            def counted(self_: Any, *a: Any, _original: Any = original, **kw: Any) -> Any:
                path = self_._method
                name = methods.get(path.decode() if isinstance(path, bytes) else path)
                if name is not None:
                    counts[name] += 1
                return _original(self_, *a, **kw)

            multicallable.__call__ = counted  # type: ignore[method-assign]
        init = SubscriberAsyncClient.__init__
        self._saved.append((SubscriberAsyncClient, "__init__", init))

        def counted_init(self_: Any, *a: Any, **kw: Any) -> None:
            counts["client"] += 1
            init(self_, *a, **kw)

        SubscriberAsyncClient.__init__ = counted_init  # type: ignore[method-assign]

    def uninstall(self) -> None:
        for owner, name, original in reversed(self._saved):
            setattr(owner, name, original)
        self._saved.clear()

    def reset(self) -> None:
        self._counts.clear()

    def counts(self) -> dict[str, int]:
        return dict(self._counts)

    def cpu_seconds(self) -> float:
        return 0.0


def _offline_service_account(project: str) -> str:
    """
    A service-account key made up on the spot, for google's hook to build credentials from.

    google's ``PubSubAsyncHook`` insists on credentials; with ``PUBSUB_EMULATOR_HOST`` set the SDK
    opens an insecure channel to the emulator and never uses them (no token is ever fetched).
    """
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa

    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    ).decode()
    return json.dumps(
        {
            "type": "service_account",
            "project_id": project,
            "private_key_id": "bench",
            "private_key": pem,
            "client_email": f"bench@{project}.iam.gserviceaccount.com",
            "client_id": "1",
            "token_uri": "https://oauth2.googleapis.com/token",
        }
    )


class PubSub:
    """Google's Pub/Sub emulator in its own process; RPCs counted at the SDK."""

    name = "pubsub"
    versions = [
        "apache-airflow",
        "google-cloud-pubsub",
        "grpcio",
        "apache-airflow-providers-google",
    ]
    PULL_MAX = 10
    """Messages per pull of google's trigger, as the SQS anchor takes 10 per receive."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self._stack = contextlib.ExitStack()
        self.counter = RpcCounter()

    def __enter__(self) -> PubSub:
        from tests.support.pubsub_emulator import pubsub_emulator_process

        if self.args.pubsub_pull_cap:
            from bench.fake_pubsub import fake_pubsub_process

            self.emulator = self._stack.enter_context(fake_pubsub_process(self.args.pubsub_pull_cap))
        else:
            data_dir = Path(tempfile.mkdtemp(prefix="bench-watchers-pubsub-"))
            self.emulator = self._stack.enter_context(pubsub_emulator_process(data_dir))
        self.pids = [self.emulator.pid]
        os.environ["PUBSUB_EMULATOR_HOST"] = self.emulator.host
        os.environ["AIRFLOW_CONN_GOOGLE_CLOUD_DEFAULT"] = json.dumps(
            self.emulator.connection(keyfile_dict=_offline_service_account(self.emulator.project))
        )
        import airflow_shared_stream.pubsub.trigger  # noqa: F401

        with contextlib.suppress(ImportError):
            import airflow.providers.google.cloud.triggers.pubsub  # noqa: F401
        self.counter.install()
        self._stack.callback(self.counter.uninstall)
        return self

    def __exit__(self, *exc: object) -> None:
        self._stack.close()

    def topic(self, messages: int, subscriptions: int = 1) -> tuple[str, list[str]]:
        topic = self.emulator.create_topic()
        subs = [
            self.emulator.create_subscription(topic, ack_deadline_seconds=60) for _ in range(subscriptions)
        ]
        self.emulator.publish(topic, [{"n": n, "kind": "order", "pad": "x" * 60} for n in range(messages)])
        return topic, subs

    async def run(self, variant: str, watchers: int, messages: int) -> Cell:
        cell = Cell("pubsub", variant, watchers, messages)
        budget, sync = self.args.budget, self.args.sync
        if variant in ("ours", "in-flight"):
            from airflow_shared_stream.pubsub.trigger import PubSubSharedStreamTrigger

            _, [sub] = self.topic(messages)
            if variant == "ours":
                await drive_shared(
                    lambda: PubSubSharedStreamTrigger(sub), cell, Meter(self.counter), budget, sync
                )
            else:
                await hold_in_flight(lambda: PubSubSharedStreamTrigger(sub), cell, budget)
        elif variant == "ceiling":
            await run_ceiling(cell, budget, sync)
        elif variant == "template":
            await run_template(cell, budget, sync)
        elif variant == "bare":
            _, [sub] = self.topic(messages)
            await self.bare(cell, sub, budget)
        elif variant == "per-watcher":
            _, subs = self.topic(messages, subscriptions=watchers)
            await self.per_watcher(cell, subs, budget)
        return cell

    async def bare(self, cell: Cell, subscription: str, budget: float) -> None:
        """SubscriberAsyncClient: pull up to 1,000, acknowledge what came, until all are done."""
        import grpc
        from google.api_core import exceptions
        from google.pubsub_v1 import SubscriberAsyncClient
        from google.pubsub_v1.services.subscriber.transports import SubscriberGrpcAsyncIOTransport

        meter = Meter(self.counter)
        meter.start()
        deadline = time.monotonic() + budget
        client = SubscriberAsyncClient(
            transport=SubscriberGrpcAsyncIOTransport(channel=grpc.aio.insecure_channel(self.emulator.host))
        )
        meter.first_event()
        try:
            while cell.delivered < cell.messages and time.monotonic() < deadline:
                try:
                    response = await client.pull(subscription=subscription, max_messages=1000, timeout=5)
                except exceptions.DeadlineExceeded:
                    continue
                received = response.received_messages
                if received:
                    await client.acknowledge(subscription=subscription, ack_ids=[r.ack_id for r in received])
                    cell.delivered += len(received)
        finally:
            meter.stop(cell, rss_kib())
            await client.transport.close()

    async def per_watcher(self, cell: Cell, subscriptions: list[str], budget: float) -> None:
        """google's PubsubPullTrigger, one per watcher on its own subscription, re-run after each event."""
        from airflow.providers.google.cloud.triggers.pubsub import PubsubPullTrigger

        def make(sub: str) -> Any:
            return PubsubPullTrigger(
                project_id=self.emulator.project,
                subscription=sub.rsplit("/", 1)[-1],
                max_messages=self.PULL_MAX,
                ack_messages=True,
                gcp_conn_id="google_cloud_default",
                poke_interval=1.0,
                return_immediately=False,
            )

        await run_pollers(
            cell,
            Meter(self.counter),
            budget,
            [lambda sub=sub: make(sub) for sub in subscriptions],
            lambda event: len(event.payload.get("message", ())),
        )
