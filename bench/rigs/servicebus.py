"""bench/watchers.py on Service Bus: the AMQP test server in a child process, azure's trigger."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import time
from typing import Any

from bench.ceilings import run_ceiling, run_template
from bench.harness import Cell, Meter, drive_shared, hold_in_flight, rss_kib, run_pollers


class ServiceBus:
    """The Service Bus test server (a protocol-level fake, tests/support) in a child process."""

    name = "servicebus"
    versions = [
        "apache-airflow",
        "azure-servicebus",
        "python-qpid-proton",
        "apache-airflow-providers-microsoft-azure",
    ]

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args

    def __enter__(self) -> ServiceBus:
        from tests.support.servicebus_server import ServiceBusServerProcess

        self.server = ServiceBusServerProcess()
        self.pids = [self.server.process.pid]
        os.environ["AIRFLOW_CONN_AZURE_SERVICE_BUS_DEFAULT"] = json.dumps(
            {"conn_type": "azure_service_bus", "schema": self.server.connection_string()}
        )
        import airflow_shared_stream.servicebus.trigger  # noqa: F401

        with contextlib.suppress(ImportError):
            import airflow.providers.microsoft.azure.triggers.message_bus  # noqa: F401
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.close()

    def _bodies(self, messages: int) -> list[Any]:
        return [{"n": n, "kind": "order", "pad": "x" * 60} for n in range(messages)]

    def queue(self, messages: int) -> str:
        name = self.server.call("create_queue", None)
        self.server.call("send", name, self._bodies(messages))
        return name

    async def run(self, variant: str, watchers: int, messages: int) -> Cell:
        cell = Cell("servicebus", variant, watchers, messages)
        budget, sync = self.args.budget, self.args.sync
        if variant in ("ours", "in-flight"):
            from airflow_shared_stream.servicebus.trigger import ServiceBusSharedStreamTrigger

            queue = self.queue(messages)

            def make() -> Any:
                return ServiceBusSharedStreamTrigger(queue_name=queue, max_wait_time=1.0)

            if variant == "ours":
                await drive_shared(make, cell, Meter(self.server), budget, sync)
            else:
                await hold_in_flight(make, cell, budget)
        elif variant == "ceiling":
            await run_ceiling(cell, budget, sync)
        elif variant == "template":
            await run_template(cell, budget, sync)
        elif variant == "bare":
            await self.bare(cell, self.queue(messages), budget)
        elif variant == "per-watcher":
            topic = self.server.call("create_topic", None)
            subs = [self.server.call("create_subscription", topic) for _ in range(watchers)]
            self.server.call("send", topic, self._bodies(messages))
            await self.per_watcher(cell, topic, subs, budget)
        return cell

    async def bare(self, cell: Cell, queue: str, budget: float) -> None:
        """azure.servicebus.aio: receive up to 100 (peek-lock), complete each, until all are done."""
        from azure.servicebus.aio import ServiceBusClient

        meter = Meter(self.server)
        meter.start()
        deadline = time.monotonic() + budget
        async with (
            ServiceBusClient.from_connection_string(self.server.connection_string()) as client,
            client.get_queue_receiver(queue, prefetch_count=0) as receiver,
        ):
            meter.first_event()
            while cell.delivered < cell.messages and time.monotonic() < deadline:
                received = await receiver.receive_messages(max_message_count=100, max_wait_time=1)
                for message in received:
                    await receiver.complete_message(message)
                cell.delivered += len(received)
            meter.stop(cell, rss_kib())

    async def per_watcher(self, cell: Cell, topic: str, subscriptions: list[str], budget: float) -> None:
        """azure's AzureServiceBusSubscriptionTrigger, one per watcher on its own subscription."""
        from airflow.providers.microsoft.azure.triggers.message_bus import (
            AzureServiceBusSubscriptionTrigger,
        )

        await run_pollers(
            cell,
            Meter(self.server),
            budget,
            [
                lambda sub=sub: AzureServiceBusSubscriptionTrigger(
                    topics=[topic], subscription_name=sub, poll_interval=1, max_wait_time=1
                )
                for sub in subscriptions
            ],
            lambda event: 1,
        )
