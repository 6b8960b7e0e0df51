"""
Kafka CPU per message through the real manager: the ceiling, ours and the official trigger.

A diagnosis beside ``bench/watchers.py`` (same harness, cells and broker rigs), for the comparison
in docs/benchmarks.rst: it prints one line per cell with the process's CPU per message and, apart,
the time the garbage collector took inside the cell and how many full (generation 2) collections
ran. A full collection walks the whole heap (all of Airflow's modules) and lands in whichever
cell allocates past its threshold, so on a loaded machine it is the largest source of spread
between turns of one variant; reading the CPU beside it tells a code change from that lottery.

Usage (the official provider on the path, as in docs/benchmarks.rst)::

    PYTHONPATH=$PWD:/path/to/official .venv/bin/python bench/kafka_cpu.py --broker noida-db \
        --partitions 3 --watchers 1 10 --variants ceiling ours official --repeats 2
    ... --profile /tmp/prof   # cProfile each cell into /tmp/prof-<variant>-<watchers>-<turn>.prof
    ... --freeze              # operator tuning: gc.freeze() after the warm-up, a separate row
    ... --variants ceiling-fresh bare bare-json ours   # the attainable bound beside ours
    ... --variants ceiling-fresh ceiling-kafka-payload # what the payload's type costs the collector

``bare`` and ``bare-json`` are aiokafka alone (``getmany`` and commit, no Airflow): each record's
value touched, or decoded with ``json.loads``. A producer on aiokafka cannot spend less than the
manager's ceiling plus that read, the bound ours is compared with at one watcher.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import gc
import os
import sys
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import harness, kafka_variants
from bench import watchers as bench_watchers
from bench.ceilings import run_ceiling, run_fresh_ceiling, run_kafka_payload_ceiling
from bench.rigs.kafka import Kafka


class CollectorClock:
    """
    CPU time the garbage collector spends, and how many collections (and full ones) ran.

    Counted from the cell's first event to its end (:class:`WindowMeter`), the span its CPU is
    measured over: a ceiling builds its messages before that, and the full collections its
    building sets off are not the cell's.
    """

    def __init__(self) -> None:
        self.seconds = 0.0
        self.collections = 0
        self.full = 0
        self.full_ms: list[float] = []
        self.counting = False
        self._started = 0.0
        gc.callbacks.append(self._note)

    def reset(self) -> None:
        self.seconds, self.collections, self.full, self.full_ms = 0.0, 0, 0, []

    def _note(self, phase: str, info: dict[str, Any]) -> None:
        if not self.counting:
            return
        if phase == "start":
            self._started = time.process_time()
            return
        spent = time.process_time() - self._started
        self.seconds += spent
        self.collections += 1
        if info["generation"] == 2:
            self.full += 1
            self.full_ms.append(spent * 1000)


class WindowMeter(harness.Meter):
    """The harness's meter, with the collector counted over the same span as the cell's CPU."""

    def __init__(self, collector: CollectorClock) -> None:
        super().__init__(None)
        self.collector = collector

    def start(self) -> None:
        self.collector.counting = False
        self.collector.reset()
        super().start()

    def first_event(self) -> None:
        super().first_event()
        self.collector.reset()
        self.collector.counting = True

    def stop(self, cell: harness.Cell, watchers_alive_rss: int) -> None:
        self.collector.counting = False
        super().stop(cell, watchers_alive_rss)


CEILINGS = {
    "ceiling": run_ceiling,
    "ceiling-fresh": run_fresh_ceiling,
    "ceiling-kafka-payload": run_kafka_payload_ceiling,  # a diagnosis: the payload's type alone
}
BARE_READS = {"bare": "touch", "bare-json": "json"}
"""The bare aiokafka read (no Airflow, no manager): each record's value touched, or JSON-decoded."""


async def run_bare(kafka: Kafka, topic: str, cell: harness.Cell, meter: harness.Meter) -> None:
    """One consumer's ``getmany`` and commit loop over ``topic``, timed from its first batch."""
    meter.start()
    await kafka_variants.bare_loop(
        kafka.bootstrap,
        topic,
        cell.messages,
        on_first_record=meter.first_event,
        on_done=lambda: meter.stop(cell, harness.rss_kib()),
        read=BARE_READS[cell.variant],
    )
    cell.delivered = cell.messages * cell.fanout  # one read per message: no watchers to fan out to


async def run_cell(
    kafka: Kafka,
    args: argparse.Namespace,
    variant: str,
    watchers: int,
    profile: str,
    collector: CollectorClock,
) -> harness.Cell:
    cell = harness.Cell("kafka", variant, watchers, args.messages)
    profiler = cProfile.Profile() if profile else None
    meter = WindowMeter(collector)
    if variant in CEILINGS:
        if profiler:
            profiler.enable()
        await CEILINGS[variant](cell, args.budget, args.sync, meter)
    elif variant in BARE_READS:
        topic = f"cpu-{uuid.uuid4().hex[:8]}"
        await kafka_variants.prepare_topic(kafka.bootstrap, topic, args.messages, args.partitions)
        if profiler:
            profiler.enable()
        await run_bare(kafka, topic, cell, meter)
    else:
        topic = f"cpu-{uuid.uuid4().hex[:8]}"
        await kafka_variants.prepare_topic(kafka.bootstrap, topic, args.messages, args.partitions)
        make_trigger = kafka_variants.make_factory(variant, kafka.bootstrap, topic)
        if profiler:
            profiler.enable()
        await harness.drive_shared(make_trigger, cell, meter, args.budget, args.sync)
    if profiler:
        profiler.disable()
        profiler.dump_stats(profile)
    return cell


async def main(args: argparse.Namespace) -> None:
    rig_args = bench_watchers.parse_args(
        ["--broker", "kafka", "--kafka-broker", args.broker, "--sync", str(args.sync)]
    )
    collector = CollectorClock()
    with Kafka(rig_args) as kafka:
        for variant in args.variants:  # one unrecorded turn each: first-use costs fall here
            if variant in BARE_READS:
                topic = f"cpu-warm-{uuid.uuid4().hex[:8]}"
                await kafka_variants.prepare_topic(kafka.bootstrap, topic, 300, args.partitions)
                await run_bare(kafka, topic, harness.Cell("kafka", variant, 1, 300), harness.Meter(None))
            elif variant not in CEILINGS:
                topic = f"cpu-warm-{uuid.uuid4().hex[:8]}"
                await kafka_variants.prepare_topic(kafka.bootstrap, topic, 300, args.partitions)
                warm = harness.Cell("kafka", variant, 1, 300)
                make_trigger = kafka_variants.make_factory(variant, kafka.bootstrap, topic)
                await harness.drive_shared(make_trigger, warm, harness.Meter(None), 60, args.sync)
        if args.freeze:
            # Operator tuning, not the provider's: what is alive now (Airflow's modules, the
            # clients) leaves the collector's view, so a full collection walks only what the
            # cells allocate. The provider never does this to the triggerer's heap.
            gc.collect()
            gc.freeze()
        for turn in range(args.repeats):
            for watchers in args.watchers:
                for variant in args.variants:
                    await bench_watchers.between_cells(kafka, rig_args)
                    profile = f"{args.profile}-{variant}-{watchers}-{turn}.prof" if args.profile else ""
                    cell = await run_cell(kafka, args, variant, watchers, profile, collector)
                    print(
                        f"{args.broker} partitions={args.partitions} watchers={watchers} {variant:13s} "
                        f"msg/s={cell.messages_per_second:.0f} cpu_us_per_msg={cell.cpu_per_1000 * 1000:.1f} "
                        f"gc_us_per_msg={collector.seconds / args.messages * 1e6:.1f} "
                        f"full_collections={collector.full} "
                        f"full_ms={'/'.join(f'{ms:.0f}' for ms in collector.full_ms) or '-'} "
                        f"error={cell.error} "
                        f"load={os.getloadavg()[0]:.2f}",
                        flush=True,
                    )


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--broker", default="noida-db", choices=["noida-db", "tansu"])
    parser.add_argument("--partitions", type=int, default=3)
    parser.add_argument("--watchers", type=int, nargs="+", default=[1, 10])
    parser.add_argument("--variants", nargs="+", default=["ceiling", "ceiling-fresh", "ours", "official"])
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--messages", type=int, default=30_000)
    parser.add_argument("--sync", type=float, default=0.01, help="seconds between persistence confirmations")
    parser.add_argument("--budget", type=float, default=120.0, help="seconds per cell at most")
    parser.add_argument(
        "--freeze",
        action="store_true",
        help="operator tuning: gc.freeze() the process's heap after the warm-up turns (not the provider's)",
    )
    parser.add_argument(
        "--profile", default="", help="cProfile each cell into <prefix>-<variant>-<N>-<turn>.prof"
    )
    return parser.parse_args()


if __name__ == "__main__":
    bench_watchers.quiet_loggers()
    asyncio.run(main(parse_args()))
