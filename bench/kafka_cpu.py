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
from bench.ceilings import run_ceiling
from bench.rigs.kafka import Kafka


class CollectorClock:
    """CPU time the garbage collector spends, and how many collections (and full ones) ran."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self.collections = 0
        self.full = 0
        self._started = 0.0
        gc.callbacks.append(self._note)

    def reset(self) -> None:
        self.seconds, self.collections, self.full = 0.0, 0, 0

    def _note(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._started = time.process_time()
            return
        self.seconds += time.process_time() - self._started
        self.collections += 1
        self.full += info["generation"] == 2


async def run_cell(
    kafka: Kafka, args: argparse.Namespace, variant: str, watchers: int, profile: str
) -> harness.Cell:
    cell = harness.Cell("kafka", variant, watchers, args.messages)
    profiler = cProfile.Profile() if profile else None
    if variant == "ceiling":
        if profiler:
            profiler.enable()
        await run_ceiling(cell, args.budget, args.sync)
    else:
        topic = f"cpu-{uuid.uuid4().hex[:8]}"
        await kafka_variants.prepare_topic(kafka.bootstrap, topic, args.messages, args.partitions)
        make_trigger = kafka_variants.make_factory(variant, kafka.bootstrap, topic)
        if profiler:
            profiler.enable()
        await harness.drive_shared(make_trigger, cell, harness.Meter(None), args.budget, args.sync)
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
            if variant != "ceiling":
                topic = f"cpu-warm-{uuid.uuid4().hex[:8]}"
                await kafka_variants.prepare_topic(kafka.bootstrap, topic, 300, args.partitions)
                warm = harness.Cell("kafka", variant, 1, 300)
                make_trigger = kafka_variants.make_factory(variant, kafka.bootstrap, topic)
                await harness.drive_shared(make_trigger, warm, harness.Meter(None), 60, args.sync)
        for turn in range(args.repeats):
            for watchers in args.watchers:
                for variant in args.variants:
                    await bench_watchers.between_cells(kafka, rig_args)
                    profile = f"{args.profile}-{variant}-{watchers}-{turn}.prof" if args.profile else ""
                    collector.reset()
                    cell = await run_cell(kafka, args, variant, watchers, profile)
                    print(
                        f"{args.broker} partitions={args.partitions} watchers={watchers} {variant:8s} "
                        f"msg/s={cell.messages_per_second:.0f} cpu_us_per_msg={cell.cpu_per_1000 * 1000:.1f} "
                        f"gc_us_per_msg={collector.seconds / args.messages * 1e6:.1f} "
                        f"full_collections={collector.full} error={cell.error} "
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
    parser.add_argument("--variants", nargs="+", default=["ceiling", "ours", "official"])
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--messages", type=int, default=30_000)
    parser.add_argument("--sync", type=float, default=0.01, help="seconds between persistence confirmations")
    parser.add_argument("--budget", type=float, default=120.0, help="seconds per cell at most")
    parser.add_argument(
        "--profile", default="", help="cProfile each cell into <prefix>-<variant>-<N>-<turn>.prof"
    )
    return parser.parse_args()


if __name__ == "__main__":
    bench_watchers.quiet_loggers()
    asyncio.run(main(parse_args()))
