"""
A Kafka redrive's commits as its group's member, with a retention of their own (issue 45, commit
97710fd: ``RedriveMembership.commit``, ``PositionStore.commit_asking_again``), attacked with
FAULT_MODEL classes 1, 5, 6, 8, 11, 12 and 15 on real Kafka-protocol brokers.

Each test says what it shows; a break is a strict ``xfail`` until it is fixed.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from aiokafka import AIOKafkaProducer

from airflow_shared_stream.common.redrive import redrive
from airflow_shared_stream.kafka import redrive_membership
from airflow_shared_stream.kafka.dead_letter import ORIGIN_HEADERS, REASON_HEADER
from airflow_shared_stream.kafka.redrive import default_group_id
from tests.integration.kafka.conftest import KafkaSandbox
from tests.integration.kafka.test_kafka_redrive import source
from tests.support.kafka_offset_expiry import KafkaOffsetExpiry

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]


async def dead_letters_on(kafka: KafkaSandbox, dlq: str, origin: str, partition: int, count: int) -> None:
    """``count`` records on one partition of ``dlq``, as our dead-lettering writes them."""
    producer = AIOKafkaProducer(bootstrap_servers=kafka.bootstrap, acks="all")
    await producer.start()
    try:
        for i in range(count):
            ours = [(name, v.encode()) for name, v in zip(ORIGIN_HEADERS, (origin, "0", str(i)), strict=True)]
            ours.append((REASON_HEADER, b"why"))
            await producer.send(
                dlq,
                value=b'{"late": %d}' % i,
                key=b"k",
                partition=partition,
                headers=ours,
            )
        await producer.flush()
    finally:
        await producer.stop()


@pytest.mark.xfail(
    strict=True,
    reason="a redrive re-commits with its own retention only the partitions it moves records on: an "
    "offset of another partition, committed with the broker's default retention (by the release "
    "before, or an operator's reset), still expires, and the next redrive copies that partition again",
)
async def test_offsets_a_redrive_did_not_move_keep_their_memory_too(
    kafka: KafkaSandbox, monkeypatch: pytest.MonkeyPatch
) -> None:
    """
    FAULT_MODEL 11 (idle time: positions idle for days never expire into a replay) and 15 (an
    operator action copies each real message once). Every redrive group that exists when 97710fd is
    deployed had its offsets committed by ``AIOKafkaConsumer.commit``: the broker's default
    retention (as has one an operator set with ``kafka-consumer-groups.sh --reset-offsets``). The
    first redrive after the upgrade commits, with its ten-year retention, only the partitions where
    it moved something. Kafka expires a group's offsets one partition at a time: seven days after
    the group went empty the others' are gone, and the next redrive reads those partitions from the
    log start and copies every record the earlier redrives moved to the origin again (every watcher
    fires again for each, days later). docs/redrive.rst: "a redrive group's memory outlives the
    dead letters".

    ``KafkaOffsetExpiry`` applies Kafka's rule, per partition, to the commits this process saw.
    """
    expiry = KafkaOffsetExpiry(monkeypatch)
    dlq, origin = kafka.name("dlq"), kafka.name("orders")
    await kafka.create_topics(dlq, partitions=2)
    await kafka.create_topics(origin)
    group = default_group_id(dlq, origin)
    await dead_letters_on(kafka, dlq, origin, 0, 3)
    await dead_letters_on(kafka, dlq, origin, 1, 4)

    # The redrive of the release before 97710fd: the same commits with the broker's default retention.
    with monkeypatch.context() as before:
        before.setattr(redrive_membership, "POSITION_RETENTION_MS", -1)
        first = await redrive(source(kafka, dlq, source=origin))
    assert first.moved == 7
    assert await kafka.committed(group, dlq, 2) == {0: 3, 1: 4}

    await dead_letters_on(kafka, dlq, origin, 0, 2)  # new dead letters, on partition 0 only
    second = await redrive(source(kafka, dlq, source=origin))  # upgraded
    assert second.moved == 2
    assert len(await kafka.read_all(origin, 9)) == 9

    month = timedelta(days=30)
    gone = sorted(tp for tp, expired in expiry.expired(group, month).items() if expired)
    await expiry.sit_idle(kafka, group, month)  # a month without a redrive
    third = await redrive(source(kafka, dlq, source=origin))
    assert third.moved == 0, (
        f"the redrive after a month copied {third.moved} record(s) already moved again (Kafka expired "
        f"the offsets of {gone})"
    )
