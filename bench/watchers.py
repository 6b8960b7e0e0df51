"""
Watchers on one stream, per broker, against the anchors a user would otherwise pick.

For each broker (SQS, Kafka, Pub/Sub, Service Bus) and each watcher count N (1, 10, 100,
1,000), in ONE run, through Airflow's real ``SharedStreamManager`` on this machine's broker:

* ``ours``: this provider's shared-stream trigger (one consumer, N watchers);
* ``ceiling``: the manager's own in-memory ceiling: Airflow's ``SharedStreamManager`` and this
  provider's watcher filter fed by :class:`bench.ceilings.CeilingProducer`, the smallest correct
  producer (messages built before the cell; take a credit, yield, settle = return the credit).
  Nothing a provider does can beat it;
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

Where the code is: this file runs the cells and writes the results; :mod:`bench.harness` is
the cell, its meter and the runs through the manager; :mod:`bench.ceilings` the in-memory
anchors; ``bench/rigs/<broker>.py`` starts each broker and runs each variant on it;
:mod:`bench.report` writes the tables.

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
import os
import random
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
OFFICIAL_PROVIDERS = ROOT / ".bench-providers"
"""google and azure providers for the anchors only (bench/install_official_providers.sh)."""
if OFFICIAL_PROVIDERS.is_dir():
    sys.path.append(str(OFFICIAL_PROVIDERS))


from bench.harness import IN_FLIGHT_WATCHERS, Cell, Meter, median_cell  # noqa: E402
from bench.machine import Settled, pin_threads, run_stamp, wait_until_idle  # noqa: E402
from bench.report import _merge, _note, render, report, table_run  # noqa: E402
from bench.rigs.kafka import Kafka  # noqa: E402
from bench.rigs.pubsub import PubSub  # noqa: E402
from bench.rigs.servicebus import ServiceBus  # noqa: E402
from bench.rigs.sqs import Sqs  # noqa: E402

__all__ = ["IN_FLIGHT_WATCHERS", "Cell", "_merge", "_note", "main", "median_cell", "render", "table_run"]

VARIANTS = ("ours", "ceiling", "template", "bare", "per-watcher", "in-flight")
"""What ``--variants`` selects; on Kafka, ``per-watcher`` runs the official shared stream (``official``)."""
BROKERS = ("sqs", "kafka", "pubsub", "servicebus")

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


@contextlib.contextmanager
def loggers_quieted() -> Iterator[None]:
    """
    :func:`quiet_loggers` for one run, the levels as they were afterwards: a test that ran
    :func:`main` in pytest's process left them at WARNING, and the next test's log capture in that
    process saw nothing at INFO.
    """
    import copy
    import importlib
    import logging

    levels = {name: logging.getLogger(name).level for name in QUIET_LOGGERS}
    namespaces = []
    for module in ("airflow._shared.logging.structlog", "airflow.sdk._shared.logging.structlog"):
        with contextlib.suppress(ImportError):
            trie = importlib.import_module(module).PER_LOGGER_LEVELS
            namespaces.append((trie, copy.deepcopy(trie)))
    quiet_loggers()
    try:
        yield
    finally:
        for name, level in levels.items():
            logging.getLogger(name).setLevel(level)
        for trie, before in namespaces:
            trie.clear()
            trie.update(before)


def main(argv: list[str] | None = None) -> dict[str, list[Cell]]:
    args = parse_args(argv)
    with loggers_quieted():
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
