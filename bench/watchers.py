"""
Watchers on one stream, per broker, against the anchors a user would otherwise pick (issue 12).

For each broker and each watcher count N (1, 10, 100), in ONE run, through Airflow's real
``SharedStreamManager`` on this machine's real broker:

* ``ours``: this provider's shared-stream trigger (one consumer, N watchers);
* ``ceiling``: the manager's own in-memory ceiling, the public
  :class:`airflow_shared_stream.testing.InMemoryProducer` (the leased-queue template without a
  broker): nothing a provider does can beat it;
* ``bare``: the broker client's own consume-and-settle loop, no Airflow (no fan-out);
* ``per-watcher``: one independent poller per watcher, as Airflow's providers do today. SQS:
  amazon's ``SqsSensorTrigger``, re-run after each event as the triggerer re-runs a watcher's
  trigger, each poller on its own queue holding every message (an SNS fan-out: N pollers on ONE
  queue would compete for the messages, and each watcher would see a tenth of them). Kafka:
  the official provider's shared-stream trigger (``apache-airflow-providers-apache-kafka``).

Measured per cell: messages/s (messages of the stream that every watcher has seen, per second),
trigger events/s (N times that), CPU seconds of the triggerer process per 1,000 messages (the
recording proxy's thread excluded; the broker runs in its own process), resident memory growth
per watcher, and broker requests per message counted on the wire by
:class:`tests.support.request_log.RecordingProxy` (SQS; Kafka's requests are not counted: the
brokers advertise their own address, so a proxy sees only the bootstrap connection).

A cell runs until every watcher has every message or its time budget is spent; rates come from
what was delivered, so a slow anchor costs its budget, not the run.

Run: ``.venv/bin/python bench/watchers.py [--broker sqs kafka] [--watchers 1 10 100]``
(needs the ``bench`` extra). Writes ``bench/results/watchers_<broker>.md`` and ``.json``; the
plots are drawn by ``bench/plot.py``.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import json
import math
import os
import random
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from airflow.sdk.module_loading import import_string  # noqa: E402
from airflow.triggers.shared_stream import SharedStreamManager  # noqa: E402

from airflow_shared_stream.testing import InMemoryProducer, InMemoryTrigger  # noqa: E402
from bench.machine import describe  # noqa: E402
from tests.support.processes import free_port, running, wait_for_port  # noqa: E402
from tests.support.request_log import RecordingProxy  # noqa: E402

VARIANTS = ("ours", "ceiling", "bare", "per-watcher")
"""What ``--variants`` selects; on Kafka, ``per-watcher`` runs the official shared stream (``official``)."""
ROWS = ("ours", "ceiling", "bare", "per-watcher", "official")


@dataclass
class Cell:
    broker: str
    variant: str
    watchers: int
    messages: int
    delivered: int = 0
    """Trigger events fired, summed over the watchers."""
    seconds: float = 0.0
    cpu_seconds: float = 0.0
    rss_growth_kib: float = 0.0
    requests: dict[str, int] = field(default_factory=dict)
    load: float = 0.0
    error: str | None = None

    @property
    def fanout(self) -> int:
        """Trigger events per message: one per watcher, none fanned out by the bare loop."""
        return 1 if self.variant == "bare" else self.watchers

    @property
    def messages_per_second(self) -> float:
        return self.delivered / self.fanout / self.seconds if self.seconds > 0 else 0.0

    @property
    def events_per_second(self) -> float:
        return self.delivered / self.seconds if self.seconds > 0 else 0.0

    @property
    def cpu_per_1000(self) -> float:
        done = self.delivered / self.fanout
        return self.cpu_seconds / done * 1000 if done else float("nan")

    @property
    def requests_per_message(self) -> float | None:
        if not self.requests:
            return None
        done = self.delivered / self.fanout
        return sum(self.requests.values()) / done if done else None

    def as_row(self) -> dict[str, Any]:
        return {
            **asdict(self),
            "messages_per_second": self.messages_per_second,
            "events_per_second": self.events_per_second,
            "cpu_per_1000": self.cpu_per_1000,
            "requests_per_message": self.requests_per_message,
        }


def rss_kib() -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


class Meter:
    """CPU seconds of this process (minus the proxy's thread), RSS, wall time, for one cell."""

    def __init__(self, proxy: RecordingProxy | None) -> None:
        self.proxy = proxy

    def _cpu(self) -> float:
        return time.process_time() - (self.proxy.cpu_seconds() if self.proxy else 0.0)

    def start(self) -> None:
        if self.proxy:
            self.proxy.reset()
        self._rss = rss_kib()
        self._cpu0 = self._cpu()

    def first_event(self) -> None:
        self._wall0 = time.perf_counter()
        self._cpu_at_first = self._cpu()

    def stop(self, cell: Cell, watchers_alive_rss: int) -> None:
        cell.seconds = time.perf_counter() - getattr(self, "_wall0", time.perf_counter())
        cell.cpu_seconds = self._cpu() - getattr(self, "_cpu_at_first", self._cpu0)
        cell.rss_growth_kib = (watchers_alive_rss - self._rss) / cell.fanout
        cell.requests = dict(self.proxy.counts()) if self.proxy else {}
        cell.load = os.getloadavg()[0]


def _rebuild(trigger: Any) -> Any:
    """As the triggerer does: the trigger it runs is built from ``serialize()``."""
    classpath, kwargs = trigger.serialize()
    return import_string(classpath)(**json.loads(json.dumps(kwargs)))


async def drive_shared(
    make_trigger: Callable[[], Any], cell: Cell, meter: Meter, budget: float, sync: float
) -> None:
    """Run ``cell.watchers`` watchers through a fresh manager until each fired ``messages`` times."""
    manager = SharedStreamManager(cohort_grace_period=0.5)
    meter.start()
    triggers = [_rebuild(make_trigger()) for _ in range(cell.watchers)]
    key = triggers[0].shared_stream_key()
    counts = [0] * cell.watchers
    done = asyncio.Event()
    unconfirmed: list[int] = []
    errors: list[str] = []
    first: list[bool] = []

    async def watcher(index: int, trigger: Any) -> None:
        stream = manager.subscribe(trigger_id=index, trigger=trigger, key=key)
        try:
            async for _event in trigger.filter_shared_stream(stream):
                await asyncio.sleep(0)  # the runner awaits a log call before binding
                seq = manager.bind_pending_event(trigger_id=index, key=key)
                if seq is not None:
                    if sync <= 0:
                        manager.confirm_persisted((seq,))
                    else:
                        unconfirmed.append(seq)
                if not first:
                    first.append(True)
                    meter.first_event()
                counts[index] += 1
                if all(c >= cell.messages for c in counts):
                    done.set()
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            errors.append(f"{type(exc).__name__}: {exc}")
            done.set()
        finally:
            await manager.unsubscribe(index, key)

    async def supervisor() -> None:
        while True:
            await asyncio.sleep(sync)
            batch, unconfirmed[:] = list(unconfirmed), []
            manager.confirm_persisted(batch)

    tasks = [asyncio.create_task(watcher(i, t)) for i, t in enumerate(triggers)]
    if sync > 0:
        tasks.append(asyncio.create_task(supervisor()))
    try:
        await asyncio.wait_for(done.wait(), budget)
    except TimeoutError:
        errors.append(f"budget of {budget:.0f}s spent: {min(counts)}/{cell.messages} at the slowest watcher")
    cell.delivered = sum(min(c, cell.messages) for c in counts)
    alive_rss = rss_kib()
    meter.stop(cell, alive_rss)
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    await manager.stop_all()
    cell.error = "; ".join(errors[:1]) or None


# -- SQS --------------------------------------------------------------------------------------


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
                [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                log_path=Path(tempfile.gettempdir()) / f"bench-watchers-moto-{port}.log",
            )
        )
        wait_for_port(port, 60, proc=proc, what="moto")
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
        self._direct_endpoint = f"http://127.0.0.1:{port}"
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

    async def warm(self) -> None:
        await _warm_sqs_client(self._direct_endpoint)

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
        elif variant == "bare":
            await self.bare(cell, self.queue(messages), budget)
        elif variant == "per-watcher":
            await self.per_watcher(cell, [self.queue(messages) for _ in range(watchers)], budget)
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


async def _warm_sqs_client(endpoint: str) -> None:
    from aiobotocore.session import get_session

    async with get_session().create_client(
        "sqs",
        region_name="us-east-1",
        endpoint_url=endpoint,
        aws_access_key_id="b",
        aws_secret_access_key="b",
    ) as sqs:
        await sqs.list_queues()


# -- Kafka ------------------------------------------------------------------------------------


class Kafka:
    """noida-db on loopback; the variants of bench/kafka_throughput.py, metered."""

    name = "kafka"
    versions = [
        "apache-airflow",
        "aiokafka",
        "confluent-kafka",
        "apache-airflow-providers-apache-kafka",
        "noida-db",
    ]

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self._stack = contextlib.ExitStack()

    def __enter__(self) -> Kafka:
        from tests.support.kafka_brokers import kafka_broker_argv

        port = free_port()
        data_dir = Path(tempfile.mkdtemp(prefix="bench-watchers-noida-"))
        proc = self._stack.enter_context(
            running(kafka_broker_argv("noida-db", port, data_dir / "data"), log_path=data_dir / "broker.log")
        )
        wait_for_port(port, 30, proc, what="noida-db")
        self.bootstrap = f"127.0.0.1:{port}"
        return self

    def __exit__(self, *exc: object) -> None:
        self._stack.close()

    async def warm(self) -> None:
        pass

    async def run(self, variant: str, watchers: int, messages: int, partitions: int = 1) -> Cell:
        from bench import kafka_throughput as kt

        name = "kafka" if partitions == 1 else f"kafka-{partitions}p"
        cell = Cell(name, "official" if variant == "per-watcher" else variant, watchers, messages)
        budget, sync = self.args.budget, self.args.sync
        kt.PARTITIONS = partitions
        topic = f"watchers-{uuid.uuid4().hex[:8]}"
        await kt.prepare_topic(self.bootstrap, topic, messages)
        if variant == "ceiling":
            await run_ceiling(cell, budget, sync, bulk=True)
        elif variant == "bare":
            meter = Meter(None)
            meter.start()
            result = await kt.bare_loop(self.bootstrap, topic, messages)
            meter.first_event()
            cell.delivered = messages
            meter.stop(cell, rss_kib())
            cell.seconds, cell.cpu_seconds = result.seconds, float("nan")
        else:
            factory = kt.make_factory("ours" if variant == "ours" else "official", self.bootstrap, topic)
            await drive_shared(factory, cell, Meter(None), budget, sync)
        return cell


class BulkInMemoryProducer(InMemoryProducer):
    """The in-memory ceiling shaped like a Kafka fetch: one receive takes every free credit."""

    receive_limit = None
    settle_batch_limit = None


class BulkInMemoryTrigger(InMemoryTrigger):
    producer_class = BulkInMemoryProducer


async def run_ceiling(cell: Cell, budget: float, sync: float, *, bulk: bool = False) -> None:
    """
    The manager's ceiling: the leased-queue template over an in-memory queue.

    ``bulk`` for Kafka: a Kafka fetch returns up to the credit window at once, where a leased
    queue receives at most ten per call; with ten the in-memory "ceiling" would sit below
    the Kafka producer it bounds.
    """
    stream = f"ceiling-{uuid.uuid4().hex[:8]}"
    queue = InMemoryProducer.queue(stream)
    for n in range(cell.messages):
        queue.publish({"n": n, "kind": "order", "pad": "x" * 60})
    trigger = BulkInMemoryTrigger if bulk else InMemoryTrigger
    try:
        await drive_shared(lambda: trigger(stream), cell, Meter(None), budget, sync)
    finally:
        InMemoryProducer.queues.pop(stream, None)


# -- the run ----------------------------------------------------------------------------------


async def bench(args: argparse.Namespace) -> dict[str, list[Cell]]:
    results: dict[str, list[Cell]] = collections.defaultdict(list)
    for broker_name in args.broker:
        broker: Any = Sqs(args) if broker_name == "sqs" else Kafka(args)
        with broker:
            await broker.warm()
            plans = [(n, 1) for n in args.watchers]
            if broker_name == "kafka" and args.kafka_partitions > 1:
                plans += [(n, args.kafka_partitions) for n in args.watchers if n <= 10]
            for watchers, partitions in plans:
                messages = args.messages.get(broker_name, {}).get(watchers) or default_messages(
                    broker_name, watchers
                )
                for variant in args.variants:
                    if broker_name == "kafka":
                        cell = await broker.run(variant, watchers, messages, partitions)
                    else:
                        cell = await broker.run(variant, watchers, messages)
                    results[cell.broker].append(cell)
                    rpm = cell.requests_per_message
                    print(
                        f"{cell.broker:9s} N={watchers:<4d} {variant:12s} "
                        f"{cell.messages_per_second:9.1f} msg/s "
                        f"{cell.events_per_second:9.1f} ev/s cpu/1k={cell.cpu_per_1000:6.2f}s "
                        f"rss/w={cell.rss_growth_kib:8.1f}KiB req/msg={'-' if rpm is None else f'{rpm:.3f}'} "
                        f"load={cell.load:.1f} {cell.requests} {cell.error or ''}",
                        flush=True,
                    )
    return results


def default_messages(broker: str, watchers: int) -> int:
    if broker == "sqs":  # moto answers ~30 receive-and-delete rounds of 10 a second here
        return {1: 600, 10: 400, 100: 100, 1000: 50}.get(watchers, 100)
    return {1: 20_000, 10: 10_000, 100: 2_000, 1000: 300}.get(watchers, 2_000)


def render(broker: str, cells: list[Cell], args: argparse.Namespace, versions: list[str]) -> str:
    lines = [
        f"# {broker}: watchers on one stream, against the anchors",
        "",
        f"Produced by `bench/watchers.py` (one run, variants taking turns per watcher count); "
        f"persistence confirmed {'at once' if args.sync <= 0 else f'every {args.sync:g} s'}; "
        f"time budget per cell {args.budget:.0f} s.",
        "",
        describe(versions),
        "",
        "| watchers | variant | messages | messages/s | trigger events/s | % of lower ceiling "
        "| CPU s / 1,000 msgs | RSS growth / watcher (KiB) | requests / message | load (1 min) | note |",
        "| ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |",
    ]
    by_n: dict[int, dict[str, Cell]] = collections.defaultdict(dict)
    for cell in cells:
        by_n[cell.watchers][cell.variant] = cell
    for n, row in sorted(by_n.items()):
        ceilings = [row[v].messages_per_second for v in ("ceiling", "bare") if v in row]
        lower = min(ceilings) if ceilings else float("nan")
        for variant in ROWS:
            if variant not in row:
                continue
            c = row[variant]
            rpm = c.requests_per_message
            cpu = "n/a" if math.isnan(c.cpu_per_1000) else f"{c.cpu_per_1000:.2f}"
            share = c.messages_per_second / lower if lower and variant not in ("ceiling", "bare") else None
            lines.append(
                f"| {n} | {variant} | {c.delivered // c.fanout} | {c.messages_per_second:,.1f} "
                f"| {c.events_per_second:,.1f} | {'' if share is None else f'{share:.0%}'} "
                f"| {cpu} | {c.rss_growth_kib:,.0f} "
                f"| {'' if rpm is None else f'{rpm:.3f}'} | {c.load:.1f} | {c.error or ''} |"
            )
    lines.append("")
    return "\n".join(lines)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--broker", nargs="+", default=["sqs", "kafka"], choices=["sqs", "kafka"])
    parser.add_argument("--watchers", nargs="+", type=int, default=[1, 10, 100])
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=VARIANTS)
    parser.add_argument("--messages", type=json.loads, default={}, help='{"sqs": {"1": 600}} overrides')
    parser.add_argument("--budget", type=float, default=90.0, help="seconds per cell at most")
    parser.add_argument(
        "--sync", type=float, default=0.0, help="persistence confirmed every S s (0: at once)"
    )
    parser.add_argument(
        "--kafka-partitions", type=int, default=3, help="also run Kafka on this many partitions"
    )
    parser.add_argument("--output-dir", type=Path, default=ROOT / "bench" / "results")
    parser.add_argument("--seed", type=int, default=12)
    args = parser.parse_args(argv)
    args.messages = {b: {int(k): v for k, v in m.items()} for b, m in args.messages.items()}
    random.seed(args.seed)
    return args


def main(argv: list[str] | None = None) -> dict[str, list[Cell]]:
    import logging

    args = parse_args(argv)
    for name in (
        "aiokafka",
        "airflow_shared_stream",
        "airflow.triggers.shared_stream",
        "airflow.providers",
        "botocore",
    ):
        logging.getLogger(name).setLevel(logging.WARNING)
    results = asyncio.run(bench(args))
    args.output_dir.mkdir(parents=True, exist_ok=True)
    for broker, cells in results.items():
        versions = Sqs.versions if broker == "sqs" else Kafka.versions
        (args.output_dir / f"watchers_{broker}.md").write_text(render(broker, cells, args, versions))
        (args.output_dir / f"watchers_{broker}.json").write_text(
            json.dumps({"load_at_end": os.getloadavg(), "cells": [c.as_row() for c in cells]}, indent=1)
        )
        print(f"wrote {args.output_dir / f'watchers_{broker}.md'}")
    return results


if __name__ == "__main__":
    main()
