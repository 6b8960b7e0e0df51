"""bench/watchers.py on SQS: moto's server behind a recording proxy, amazon's trigger as the anchor."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import sys
import tempfile
import time
import uuid
from pathlib import Path

from bench.ceilings import run_ceiling, run_template
from bench.harness import ROOT, Cell, Meter, _rebuild, drive_shared, hold_in_flight, rss_kib
from tests.support.processes import free_port, running, wait_for_port
from tests.support.request_log import RecordingProxy


class Sqs:
    """moto's SQS server in its own process, behind a recording proxy."""

    name = "sqs"
    versions = ["apache-airflow", "aiobotocore", "moto", "apache-airflow-providers-amazon"]

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self._stack = contextlib.ExitStack()

    def __enter__(self) -> Sqs:
        import boto3

        port = free_port()
        proc = self._stack.enter_context(
            running(
                [sys.executable, "-m", "tests.support.moto_sqs", "-H", "127.0.0.1", "-p", str(port)],
                log_path=Path(tempfile.gettempdir()) / f"bench-watchers-moto-{port}.log",
                cwd=ROOT,  # moto guarded against its own races (tests/support/moto_sqs.py)
            )
        )
        wait_for_port(port, 60, proc=proc, what="moto")
        self.pids = [proc.pid]
        self.proxy = self._stack.enter_context(RecordingProxy("127.0.0.1", port))
        os.environ["AIRFLOW_CONN_AWS_DEFAULT"] = json.dumps(
            {
                "conn_type": "aws",
                "login": "bench",
                "password": "bench",
                "extra": {"region_name": "us-east-1", "endpoint_url": self.proxy.endpoint_url},
            }
        )
        # Imports and botocore's service model are loaded once here, so the first cell's
        # "memory per watcher" is not the library's own footprint.
        import aiobotocore.session  # noqa: F401

        import airflow_shared_stream.sqs.trigger  # noqa: F401

        with contextlib.suppress(ImportError):
            import airflow.providers.amazon.aws.triggers.sqs  # noqa: F401
        # The benchmark's own set-up calls go straight to moto, not through the proxy.
        self.direct = boto3.client(
            "sqs",
            region_name="us-east-1",
            endpoint_url=f"http://127.0.0.1:{port}",
            aws_access_key_id="bench",
            aws_secret_access_key="bench",
        )
        return self

    def __exit__(self, *exc: object) -> None:
        self._stack.close()

    def queue(self, messages: int) -> str:
        url = self.direct.create_queue(QueueName=f"watchers-{uuid.uuid4().hex[:10]}")["QueueUrl"]
        for start in range(0, messages, 10):
            entries = [
                {"Id": str(i), "MessageBody": json.dumps({"n": start + i, "kind": "order", "pad": "x" * 60})}
                for i in range(min(10, messages - start))
            ]
            self.direct.send_message_batch(QueueUrl=url, Entries=entries)
        return url

    def meter(self) -> Meter:
        return Meter(self.proxy)

    async def run(self, variant: str, watchers: int, messages: int) -> Cell:
        cell = Cell("sqs", variant, watchers, messages)
        budget, sync = self.args.budget, self.args.sync
        if variant == "ours":
            from airflow_shared_stream.sqs.trigger import SqsSharedStreamTrigger

            url = self.queue(messages)
            await drive_shared(
                lambda: SqsSharedStreamTrigger(url, wait_time_seconds=1), cell, self.meter(), budget, sync
            )
        elif variant == "ceiling":
            await run_ceiling(cell, budget, sync)
        elif variant == "template":
            await run_template(cell, budget, sync)
        elif variant == "bare":
            await self.bare(cell, self.queue(messages), budget)
        elif variant == "per-watcher":
            await self.per_watcher(cell, [self.queue(messages) for _ in range(watchers)], budget)
        elif variant == "in-flight":
            from airflow_shared_stream.sqs.trigger import SqsSharedStreamTrigger

            url = self.queue(messages)
            await hold_in_flight(lambda: SqsSharedStreamTrigger(url, wait_time_seconds=1), cell, budget)
        return cell

    async def bare(self, cell: Cell, url: str, budget: float) -> None:
        from aiobotocore.session import get_session

        meter = self.meter()
        meter.start()
        deadline = time.monotonic() + budget
        async with get_session().create_client(
            "sqs",
            region_name="us-east-1",
            endpoint_url=self.proxy.endpoint_url,
            aws_access_key_id="bench",
            aws_secret_access_key="bench",
        ) as sqs:
            meter.first_event()
            while cell.delivered < cell.messages and time.monotonic() < deadline:
                received = (
                    await sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10, WaitTimeSeconds=1)
                ).get("Messages", [])
                if received:
                    entries = [
                        {"Id": str(i), "ReceiptHandle": m["ReceiptHandle"]} for i, m in enumerate(received)
                    ]
                    await sqs.delete_message_batch(QueueUrl=url, Entries=entries)
                    cell.delivered += len(received)
            meter.stop(cell, rss_kib())

    async def per_watcher(self, cell: Cell, urls: list[str], budget: float) -> None:
        """amazon's SqsSensorTrigger, one per watcher, each re-run after every event."""
        from airflow.providers.amazon.aws.triggers.sqs import SqsSensorTrigger

        meter = self.meter()
        meter.start()
        meter.first_event()
        counts = [0] * len(urls)

        async def poller(index: int, url: str) -> None:
            while counts[index] < cell.messages:
                trigger = _rebuild(
                    SqsSensorTrigger(url, max_messages=10, wait_time_seconds=1, waiter_delay=1)
                )
                async for event in trigger.run():
                    counts[index] += len(event.payload.get("message_batch", ()))
                    break

        tasks = [asyncio.create_task(poller(i, url)) for i, url in enumerate(urls)]
        try:
            await asyncio.wait_for(asyncio.gather(*tasks), budget)
        except TimeoutError:
            cell.error = (
                f"budget of {budget:.0f}s spent: {min(counts)}/{cell.messages} at the slowest watcher"
            )
        cell.delivered = sum(min(c, cell.messages) for c in counts)
        meter.stop(cell, rss_kib())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
