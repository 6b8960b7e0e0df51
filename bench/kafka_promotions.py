"""
What a Kafka cell lets the garbage collector promote, per message, by type.

A diagnosis beside ``bench/kafka_cpu.py``: at the start of every generation-1 collection it counts
the objects in the two young generations by type; the ones that survive that collection go to the
oldest generation, and in CPython 3.11 a full collection (the whole heap, Airflow's modules
included) runs once the objects promoted since the last one exceed a quarter of it. Counted from
the cell's first event to its end. Objects that are garbage, and tuples the collection stops
tracking (all-atomic ones, such as the broker payload), are counted too: read it as the upper
bound of what is promoted. Slow (it walks the young generations each time): never read its CPU.

Usage::

    PYTHONPATH=$PWD .venv/bin/python bench/kafka_promotions.py --broker tansu --watchers 1 10 \
        --variants ceiling-fresh ours
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import gc
import sys
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import harness, kafka_variants
from bench import watchers as bench_watchers
from bench.kafka_cpu import CEILINGS
from bench.rigs.kafka import Kafka


class PromotionCensus(harness.Meter):
    """The harness's meter, counting the young generations by type at each generation-1 collection."""

    def __init__(self) -> None:
        super().__init__(None)
        self.types: collections.Counter[str] = collections.Counter()
        self.collections = [0, 0, 0]
        self.counting = False
        gc.callbacks.append(self._note)

    def first_event(self) -> None:
        super().first_event()
        self.counting = True

    def stop(self, cell: harness.Cell, watchers_alive_rss: int) -> None:
        self.counting = False
        super().stop(cell, watchers_alive_rss)

    def _note(self, phase: str, info: dict[str, Any]) -> None:
        if not self.counting or phase != "start":
            return
        generation = info["generation"]
        self.collections[generation] += 1
        if generation == 1:
            for young in (0, 1):
                self.types.update(type(o).__qualname__ for o in gc.get_objects(young))


async def main(args: argparse.Namespace) -> None:
    rig_args = bench_watchers.parse_args(
        ["--broker", "kafka", "--kafka-broker", args.broker, "--sync", str(args.sync)]
    )
    with Kafka(rig_args) as kafka:
        for watchers in args.watchers:
            for variant in args.variants:
                await bench_watchers.between_cells(kafka, rig_args)
                cell = harness.Cell("kafka", variant, watchers, args.messages)
                census = PromotionCensus()
                if variant in CEILINGS:
                    await CEILINGS[variant](cell, args.budget, args.sync, census)
                else:
                    topic = f"gc-{uuid.uuid4().hex[:8]}"
                    await kafka_variants.prepare_topic(kafka.bootstrap, topic, args.messages, args.partitions)
                    make_trigger = kafka_variants.make_factory(variant, kafka.bootstrap, topic)
                    await harness.drive_shared(make_trigger, cell, census, args.budget, args.sync)
                gc.callbacks.remove(census._note)
                total = sum(census.types.values())
                print(
                    f"{args.broker} partitions={args.partitions} watchers={watchers} {variant}: "
                    f"collections={census.collections} young_at_gen1_per_msg={total / args.messages:.1f} "
                    f"error={cell.error}",
                    flush=True,
                )
                for name, count in census.types.most_common(args.top):
                    print(f"    {name:32s} {count / args.messages:6.2f}/msg", flush=True)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--broker", default="noida-db", choices=["noida-db", "tansu"])
    parser.add_argument("--partitions", type=int, default=3)
    parser.add_argument("--watchers", type=int, nargs="+", default=[1, 10])
    parser.add_argument("--variants", nargs="+", default=["ceiling", "ceiling-fresh", "ours"])
    parser.add_argument("--messages", type=int, default=30_000)
    parser.add_argument("--sync", type=float, default=0.01)
    parser.add_argument("--budget", type=float, default=300.0)
    parser.add_argument("--top", type=int, default=10)
    return parser.parse_args()


if __name__ == "__main__":
    bench_watchers.quiet_loggers()
    asyncio.run(main(parse_args()))
