"""
The Kafka side of ``bench/watchers.py``: a topic filled on noida-db, the two shared-stream
triggers (ours on aiokafka, the official provider's on confluent-kafka) and the bare aiokafka
consume-and-commit loop.

Several partitions on noida-db: it answers a fetch at the end of a partition at once instead of
waiting ``fetch.wait.max.ms`` (Tansu and Kafka wait), so an idle aiokafka consumer sends empty
fetches in a loop there. The three-partition rows measure our per-lane cost despite that quirk;
read them beside the one-partition rows.
"""

from __future__ import annotations

import asyncio
import json
import os
import uuid
from collections.abc import Callable
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from airflow_shared_stream.common.trigger import DEFAULT_MAX_IN_FLIGHT
from airflow_shared_stream.kafka.trigger import KafkaSharedStreamTrigger


def _connection(conn_id: str, bootstrap: str, group_id: str) -> None:
    """An Airflow connection (environment variable) both triggers read: the official provider's shape."""
    extra = {
        "bootstrap.servers": bootstrap,
        "group.id": group_id,
        "enable.auto.commit": "false",
        "auto.offset.reset": "earliest",
    }
    os.environ[f"AIRFLOW_CONN_{conn_id.upper()}"] = json.dumps({"conn_type": "kafka", "extra": extra})


def make_factory(variant: str, bootstrap: str, topic: str) -> Callable[[], Any]:
    """A trigger factory for ``ours`` or ``official``, each on a connection and group of its own."""
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
    raise ValueError(variant)


async def prepare_topic(bootstrap: str, topic: str, count: int, partitions: int = 1) -> None:
    """Create ``topic`` and produce ``count`` ~100-byte JSON messages, round-robin over its partitions."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(topic, num_partitions=partitions, replication_factor=1)])
    finally:
        await admin.close()
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=5)
    await producer.start()
    try:
        pending = []
        for i in range(count):
            value = json.dumps({"n": i, "kind": "order", "pad": "x" * 60}).encode()
            pending.append(await producer.send(topic, value=value, partition=i % partitions))
        await producer.flush()
        await asyncio.gather(*pending)
    finally:
        await producer.stop()


async def bare_loop(
    bootstrap: str,
    topic: str,
    messages: int,
    *,
    on_first_record: Callable[[], None],
    on_done: Callable[[], None],
    read: str = "count",
) -> None:
    """
    aiokafka ``getmany`` and commit until ``messages`` are read and committed.

    ``read`` is what the loop does with each record: ``count`` only counts the batch, ``touch``
    reads each record's value, ``json`` decodes it with ``json.loads``: the least a producer on
    aiokafka must do per record, without and with the decoding a JSON payload needs.

    ``on_first_record`` is called when the first batch arrives and ``on_done`` after the last
    commit, before the consumer stops: the caller's meter times exactly that span (its wall
    time, this process's CPU and the broker's), as it does for the shared-stream variants from
    their first trigger event.
    """
    consumer = AIOKafkaConsumer(
        topic,
        bootstrap_servers=bootstrap,
        group_id=f"bare-{uuid.uuid4().hex[:8]}",
        enable_auto_commit=False,
        auto_offset_reset="earliest",
    )
    await consumer.start()
    try:
        seen, started = 0, False
        while seen < messages:
            batch = await consumer.getmany(timeout_ms=500, max_records=DEFAULT_MAX_IN_FLIGHT)
            if batch and not started:
                started = True
                on_first_record()
            for records in batch.values():
                seen += len(records)
                if read == "touch":
                    for record in records:
                        record.value  # noqa: B018 - the read itself is what is measured
                elif read == "json":
                    for record in records:
                        json.loads(record.value)
            if batch:
                await consumer.commit()
        on_done()
    finally:
        await consumer.stop()
