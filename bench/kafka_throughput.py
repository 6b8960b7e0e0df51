"""
Kafka shared-stream throughput through Airflow's real ``SharedStreamManager``, on noida-db.

Four variants in one run, for 1, 10 and 100 subscribers (every subscriber fires one trigger event
per message):

* ``ours``: :class:`airflow_shared_stream.kafka.trigger.KafkaSharedStreamTrigger` (aiokafka);
* ``official``: ``airflow.providers.apache.kafka.triggers.shared_stream.KafkaSharedStreamTrigger``
  (confluent-kafka, one thread hop per single-message poll);
* ``ceiling``: the public in-memory producer (:class:`airflow_shared_stream.testing.InMemoryProducer`,
  the leased-queue template without a broker) with the same filter and credit window as ours:
  the manager's own ceiling, which no provider can beat;
* ``bare``: an aiokafka consume-and-commit loop without Airflow (no fan-out: the broker and
  client's own ceiling, independent of the subscriber count).

Each subscriber is driven as the triggerer drives it (rebuilt from ``serialize()``, subscribed,
filtered, each trigger event bound) and the simulated supervisor confirms persistence either at
once or every second (``--sync 1.0``; Airflow's state sync takes 1-1.4 s). With a one-second sync
the credit window bounds our producer to ``max_in_flight`` messages per confirmation round.

Throughput is messages per second from the first trigger event to the moment every subscriber
has fired for every message (a consumer's start-up and group join are not counted); each cell
is the median of ``--repeat`` runs (3), the variants taking turns so that load from other
processes on the machine hits them alike.

Run: ``.venv/bin/python bench/kafka_throughput.py`` (writes ``bench/results/kafka.md``).
Needs the ``bench`` extra (``pip install -e .[bench]``) for the official provider.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass
from importlib.metadata import version
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer  # noqa: E402
from aiokafka.admin import AIOKafkaAdminClient, NewTopic  # noqa: E402
from airflow.sdk.module_loading import import_string  # noqa: E402
from airflow.triggers.shared_stream import SharedStreamManager  # noqa: E402

from airflow_shared_stream.common.trigger import DEFAULT_MAX_IN_FLIGHT  # noqa: E402
from airflow_shared_stream.kafka.trigger import KafkaSharedStreamTrigger  # noqa: E402
from airflow_shared_stream.testing import InMemoryProducer, InMemoryTrigger  # noqa: E402
from tests.support.kafka_brokers import kafka_broker_argv  # noqa: E402
from tests.support.processes import free_port, running, wait_for_port  # noqa: E402

PARTITIONS = 1
"""One partition by default: noida-db answers a fetch at the end of a partition at once instead of
waiting ``fetch.wait.max.ms`` (an idle aiokafka consumer sends ~1,500 empty fetches a second
there; Tansu and Kafka wait). With several partitions, the first one drained makes the consumer
spin on it for the rest of the run, which measures that broker quirk rather than the providers.
Set ``--partitions`` to see it."""
VARIANTS = ("ours", "official", "ceiling", "bare")
SUBSCRIBERS = (1, 10, 100)


# -- driving subscribers like the triggerer -----------------------------------------------------


@dataclass
class RunResult:
    messages: int
    seconds: float
    error: str | None = None

    @property
    def rate(self) -> float:
        return self.messages / self.seconds if self.seconds > 0 else 0.0


def _rebuild(trigger: Any) -> Any:
    classpath, kwargs = trigger.serialize()
    return import_string(classpath)(**json.loads(json.dumps(kwargs)))


async def drive(make_trigger: Any, subscribers: int, messages: int, sync: float, timeout: float) -> RunResult:
    """Run ``subscribers`` watchers through a fresh manager until each fired ``messages`` times."""
    manager = SharedStreamManager(cohort_grace_period=0.5)
    triggers = [_rebuild(make_trigger()) for _ in range(subscribers)]
    key = triggers[0].shared_stream_key()
    counts = [0] * subscribers
    finished = asyncio.Event()
    remaining = subscribers
    started: list[float] = []
    unconfirmed: list[int] = []
    errors: list[str] = []

    async def subscriber(index: int, trigger: Any) -> None:
        nonlocal remaining
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
                if not started:
                    started.append(time.perf_counter())
                counts[index] += 1
                if counts[index] == messages:
                    remaining -= 1
                    if remaining == 0:
                        finished.set()
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            errors.append(f"{type(exc).__name__}: {exc}")
            finished.set()
        finally:
            await manager.unsubscribe(index, key)

    async def supervisor() -> None:
        while True:
            await asyncio.sleep(sync)
            batch, unconfirmed[:] = list(unconfirmed), []
            manager.confirm_persisted(batch)

    tasks = [asyncio.create_task(subscriber(i, t)) for i, t in enumerate(triggers)]
    if sync > 0:
        tasks.append(asyncio.create_task(supervisor()))
    try:
        await asyncio.wait_for(finished.wait(), timeout)
        end = time.perf_counter()
    except TimeoutError:
        end = time.perf_counter()
        errors.append(f"timed out after {timeout}s: {min(counts)}/{messages} messages")
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await manager.stop_all()
    seconds = end - started[0] if started else 0.0
    return RunResult(messages=messages, seconds=seconds, error="; ".join(errors[:1]) or None)


async def bare_loop(bootstrap: str, topic: str, messages: int) -> RunResult:
    consumer = AIOKafkaConsumer(
        topic,
        bootstrap_servers=bootstrap,
        group_id=f"bare-{uuid.uuid4().hex[:8]}",
        enable_auto_commit=False,
        auto_offset_reset="earliest",
    )
    await consumer.start()
    try:
        seen, start = 0, None
        while seen < messages:
            batch = await consumer.getmany(timeout_ms=500, max_records=DEFAULT_MAX_IN_FLIGHT)
            if batch and start is None:
                start = time.perf_counter()
            for records in batch.values():
                seen += len(records)
            if batch:
                await consumer.commit()
        return RunResult(messages=messages, seconds=time.perf_counter() - (start or time.perf_counter()))
    finally:
        await consumer.stop()


# -- the run ------------------------------------------------------------------------------------


def _connection(conn_id: str, bootstrap: str, group_id: str) -> None:
    extra = {
        "bootstrap.servers": bootstrap,
        "group.id": group_id,
        "enable.auto.commit": "false",
        "auto.offset.reset": "earliest",
    }
    os.environ[f"AIRFLOW_CONN_{conn_id.upper()}"] = json.dumps({"conn_type": "kafka", "extra": extra})


def make_factory(variant: str, bootstrap: str, topic: str, messages: int = 0) -> Any:
    """A trigger factory for ``variant``; the ceiling's in-memory stream gets ``messages`` first."""
    run_id = uuid.uuid4().hex[:8]
    conn_id = f"bench_{variant}_{run_id}"
    _connection(conn_id, bootstrap, f"bench-{variant}-{run_id}")
    if variant == "ours":
        return lambda: KafkaSharedStreamTrigger([topic], kafka_config_id=conn_id)
    if variant == "official":
        from airflow.providers.apache.kafka.triggers.shared_stream import (
            KafkaSharedStreamTrigger as OfficialTrigger,
        )

        return lambda: OfficialTrigger(topics=[topic], kafka_config_id=conn_id)
    if variant == "ceiling":
        stream = f"bench-ceiling-{run_id}"
        queue = InMemoryProducer.queue(stream)
        for n in range(messages):
            queue.publish({"n": n, "kind": "order", "pad": "x" * 60})
        return lambda: InMemoryTrigger(stream)
    raise ValueError(variant)


async def prepare_topic(bootstrap: str, topic: str, count: int) -> None:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(topic, num_partitions=PARTITIONS, replication_factor=1)])
    finally:
        await admin.close()
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=5)
    await producer.start()
    try:
        pending = []
        for i in range(count):
            value = json.dumps({"n": i, "kind": "order", "pad": "x" * 60}).encode()
            pending.append(await producer.send(topic, value=value, partition=i % PARTITIONS))
        await producer.flush()
        await asyncio.gather(*pending)
    finally:
        await producer.stop()


def machine_info() -> dict[str, str]:
    model = next(
        (
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("model name")
        ),
        platform.processor(),
    )
    mem_kb = next(
        int(line.split()[1])
        for line in Path("/proc/meminfo").read_text().splitlines()
        if line.startswith("MemTotal")
    )
    return {
        "cores": str(os.cpu_count()),
        "cpu": model,
        "ram": f"{mem_kb / 1024 / 1024:.1f} GiB",
        "load": " ".join(f"{x:.2f}" for x in os.getloadavg()),
        "python": platform.python_version(),
        "aiokafka": version("aiokafka"),
        "confluent-kafka": version("confluent-kafka"),
        "apache-airflow": version("apache-airflow"),
        "apache-airflow-providers-apache-kafka": version("apache-airflow-providers-apache-kafka"),
        "noida-db": version("noida-db"),
    }


async def bench(bootstrap: str, args: argparse.Namespace) -> dict[tuple[float, int, str], RunResult]:
    topic = f"bench-{uuid.uuid4().hex[:8]}"
    sizes = {1: args.messages_1, 10: args.messages_10, 100: args.messages_100}
    await prepare_topic(bootstrap, topic, max(sizes.values()))
    results: dict[tuple[float, int, str], RunResult] = {}
    for sync in args.sync:
        for subscribers in SUBSCRIBERS:
            count = sizes[subscribers] if sync <= 0 else min(sizes[subscribers], args.messages_sync)
            runs: dict[str, list[RunResult]] = {variant: [] for variant in VARIANTS}
            # Variants take turns, so load from other processes on the machine hits all alike.
            for _ in range(args.repeat):
                for variant in VARIANTS:
                    if variant == "bare":
                        result = await bare_loop(bootstrap, topic, count)
                    else:
                        factory = make_factory(variant, bootstrap, topic, count)
                        result = await drive(factory, subscribers, count, sync, args.timeout)
                    runs[variant].append(result)
                    print(
                        f"sync={sync:g}s subscribers={subscribers:>3} {variant:<8} "
                        f"{result.rate:>9.0f} msg/s ({count} msgs in {result.seconds:.2f}s)"
                        + (f"  ERROR {result.error}" if result.error else ""),
                        flush=True,
                    )
            for variant, variant_runs in runs.items():
                results[(sync, subscribers, variant)] = median_run(variant_runs)
    return results


def median_run(runs: list[RunResult]) -> RunResult:
    """The run with the median rate; an error in any run is kept."""
    ordered = sorted(runs, key=lambda r: r.rate)
    chosen = ordered[len(ordered) // 2]
    errors = [r.error for r in runs if r.error]
    return RunResult(chosen.messages, chosen.seconds, errors[0] if errors else None)


def render(
    results: dict[tuple[float, int, str], RunResult], info: dict[str, str], args: argparse.Namespace
) -> str:
    lines = [
        "# Kafka shared-stream throughput",
        "",
        f"Recorded {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} by `bench/kafka_throughput.py` "
        f"(one run, all variants, noida-db on loopback, {PARTITIONS} partition(s), ~100-byte JSON messages).",
        "",
        f"Machine: {info['cores']} cores, {info['cpu']}, {info['ram']} RAM; "
        f"load average (1/5/15 min) {info['load']} at start, {info.get('load_end', '?')} at the end "
        "(other work shares the machine).",
        f"Versions: Python {info['python']}, aiokafka {info['aiokafka']}, confluent-kafka "
        f"{info['confluent-kafka']}, apache-airflow {info['apache-airflow']}, "
        f"apache-airflow-providers-apache-kafka {info['apache-airflow-providers-apache-kafka']}, "
        f"noida-db {info['noida-db']}.",
        "",
        f"Messages per second (median of {args.repeat} runs, variants taking turns), from the first "
        "trigger event until every subscriber has fired for every message; each subscriber fires one "
        "trigger event per message. `ceiling` is an in-memory producer "
        "through the same manager and filter (nothing a provider does can beat it); `bare` is aiokafka "
        "consume-and-commit without Airflow (no fan-out).",
    ]
    for sync in args.sync:
        title = "persistence confirmed at once" if sync <= 0 else f"persistence confirmed every {sync:g} s"
        lines += [
            "",
            f"## {title}",
            "",
            "| subscribers | ours (aiokafka) | official (confluent-kafka) | ceiling (in-memory) "
            "| bare aiokafka | ours / ceiling | official / ceiling | ours / official |",
            "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
        ]
        for subscribers in SUBSCRIBERS:
            r = {v: results[(sync, subscribers, v)] for v in VARIANTS}

            def cell(variant: str, r: dict[str, RunResult] = r) -> str:
                res = r[variant]
                return f"{res.rate:,.0f}" + (" (error)" if res.error else "")

            ceiling = r["ceiling"].rate or float("nan")
            official = r["official"].rate or float("nan")
            lines.append(
                f"| {subscribers} | {cell('ours')} | {cell('official')} | {cell('ceiling')} | {cell('bare')} "
                f"| {r['ours'].rate / ceiling:.0%} | {r['official'].rate / ceiling:.0%} "
                f"| {r['ours'].rate / official:.1f}x |"
            )
        errors = [
            f"- {v} at {n} subscribers: {res.error}"
            for (s, n, v), res in results.items()
            if s == sync and res.error
        ]
        if errors:
            lines += ["", "Errors:", *errors]
    lines += [
        "",
        f"Messages per run: {args.messages_1} (1 subscriber), {args.messages_10} (10), "
        f"{args.messages_100} (100)"
        + (f"; {args.messages_sync} with a simulated state sync." if any(s > 0 for s in args.sync) else "."),
        f"Our trigger runs with the default credit window (max_in_flight={DEFAULT_MAX_IN_FLIGHT}); with a "
        "state sync of S seconds it cannot exceed max_in_flight / S messages per second, by design: "
        "that bound is what keeps a slow metadata database from being buried under unconfirmed events. "
        "The official trigger has no such bound.",
        "",
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--messages-1", type=int, default=30_000)
    parser.add_argument("--messages-10", type=int, default=20_000)
    parser.add_argument("--messages-100", type=int, default=4_000)
    parser.add_argument("--messages-sync", type=int, default=2_500)
    parser.add_argument("--sync", type=float, nargs="+", default=[0.0, 1.0])
    parser.add_argument("--timeout", type=float, default=240.0)
    parser.add_argument("--partitions", type=int, default=PARTITIONS)
    parser.add_argument("--repeat", type=int, default=3, help="runs per cell; the median is reported")
    parser.add_argument("--output", type=Path, default=ROOT / "bench" / "results" / "kafka.md")
    args = parser.parse_args()
    globals()["PARTITIONS"] = args.partitions

    import logging

    # Airflow's logging prints INFO from every library; the benchmark prints its own lines.
    for name in ("aiokafka", "airflow_shared_stream", "airflow.triggers.shared_stream", "airflow.providers"):
        logging.getLogger(name).setLevel(logging.WARNING)
    info = machine_info()
    port = free_port()
    data_dir = Path(tempfile.mkdtemp(prefix="bench-noida-"))
    with running(
        kafka_broker_argv("noida-db", port, data_dir / "data"), log_path=data_dir / "broker.log"
    ) as proc:
        wait_for_port(port, 30, proc, what="noida-db")
        results = asyncio.run(bench(f"127.0.0.1:{port}", args))
    info["load_end"] = " ".join(f"{x:.2f}" for x in os.getloadavg())
    report = render(results, info, args)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(report)
    print(report)


if __name__ == "__main__":
    main()
