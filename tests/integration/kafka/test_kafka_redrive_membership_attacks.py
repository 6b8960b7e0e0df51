"""
Kafka redrive as a member of its consumer group (issue 45, ``kafka/redrive_membership.py``),
attacked with FAULT_MODEL classes 11 and 15 on real Kafka-protocol brokers.

Each test says what it shows; a break is a strict ``xfail`` until it is fixed.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from datetime import timedelta

import pytest
from aiokafka import AIOKafkaConsumer

from airflow_shared_stream.common.redrive import redrive
from airflow_shared_stream.kafka.redrive import default_group_id
from tests.integration.kafka.conftest import KafkaSandbox
from tests.integration.kafka.test_kafka_redrive import dead_letters, source, topics
from tests.support.kafka_offset_expiry import KafkaOffsetExpiry

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]


@contextlib.asynccontextmanager
async def another_member(kafka: KafkaSandbox, group_id: str, topic: str) -> AsyncIterator[AIOKafkaConsumer]:
    """
    A member of the redrive's group that holds what the coordinator gives it and commits nothing:
    what a dry run of a Dag of one's own (same default group) is to the coordinator.
    """
    consumer = AIOKafkaConsumer(
        bootstrap_servers=kafka.bootstrap,
        group_id=group_id,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
    )
    await consumer.start()
    try:
        consumer.subscribe([topic])
        while not consumer.assignment():
            await consumer.getmany(timeout_ms=200)  # joins; reads nothing it commits
        yield consumer
    finally:
        await consumer.stop()


async def test_a_redrive_given_part_of_the_topic_never_says_nothing_is_left(kafka: KafkaSandbox) -> None:
    """
    FAULT_MODEL 15 (an operator action reports what it did to real messages). Another member of
    the redrive's group (a dry run, or a Dag of one's own, on the default group) holds a partition
    of the dead-letter topic: the coordinator gives this redrive only the other one. It moves that
    partition's records and ends; docs/redrive.rst says ``left`` is what of the snapshot is still
    in the dead-letter source when it ended, *including what it did not reach*, and ``None`` when
    the broker cannot count. The summary said ``left: 0`` while the other partition's ten records
    were all still there, untouched: the page and the XCom tell the operator the dead letters are
    all home.
    """
    dlq, origin = kafka.name("dlq"), kafka.name("orders")
    await kafka.create_topics(dlq, partitions=2)
    await kafka.create_topics(origin)
    await dead_letters(kafka, dlq, origin, 20)  # keys k0..k3: both partitions get records
    group = default_group_id(dlq, origin)

    async with another_member(kafka, group, dlq):
        summary = await asyncio.wait_for(redrive(source(kafka, dlq, source=origin), batch_size=5), 120)

    assert 0 < summary.moved < 20, summary  # the coordinator split the topic
    left = 20 - summary.moved
    assert summary.left is None or summary.left >= left, (
        f"the redrive reported left={summary.left} while {left} record(s) it never reached are still "
        "in the dead-letter topic"
    )


async def test_a_redrive_after_its_group_sat_idle_for_days_copies_nothing_twice(
    kafka: KafkaSandbox, monkeypatch: pytest.MonkeyPatch
) -> None:
    """
    FAULT_MODEL 11 (idle time: positions of something idle for days do not expire into a skip, nor
    into a replay). Redrives are occasional: between two of them the redrive group has no member,
    and Kafka deletes the offsets of a group empty for ``offsets.retention.minutes`` (7 days by
    default); a dead-letter topic commonly keeps its records longer (that is what it is for). The
    next redrive has no committed offset and starts at ``earliest``: every record the earlier
    redrive moved is produced to its origin again and every watcher of the origin fires again for
    each, days after. docs/redrive.rst says the group "remembers how far the redrives got", with no
    limit; docs/kafka.rst refreshes a stream's positions every minute for exactly this reason, but
    nothing refreshes a redrive group's. Fixed: the redrive commits with a retention of its own.

    The test brokers expire nothing: ``KafkaOffsetExpiry`` applies Kafka's rule to what this
    process committed, and deletes the group's offsets when Kafka would have.
    """
    expiry = KafkaOffsetExpiry(monkeypatch)
    dlq, origin = await topics(kafka)
    await dead_letters(kafka, dlq, origin, 6)
    first = await redrive(source(kafka, dlq, source=origin))
    assert first.moved == 6
    assert len(await kafka.read_all(origin, 6)) == 6

    group = default_group_id(dlq, origin)
    await expiry.sit_idle(kafka, group, timedelta(days=30))  # a month without a redrive
    await dead_letters(kafka, dlq, origin, 2)
    second = await redrive(source(kafka, dlq, source=origin))

    assert second.moved == 2, f"the second redrive moved {second.moved}: the first one's six again"
    assert len(await kafka.read_all(origin, 9, timeout_ms=2000)) == 8


async def test_a_rebalance_while_a_fetch_waits_loses_nothing(
    kafka: KafkaSandbox, monkeypatch: pytest.MonkeyPatch
) -> None:
    """
    FAULT_MODEL 15 and 5 (a redrive acts on real messages; its partitions are a lease the group
    coordinator can move). A redrive's ``getmany`` waits up to a second for a fetch; a rebalance
    that begins and ends meanwhile (another redrive of the group joins or leaves: the redrive keeps
    its partition) makes the redrive drop what the fetch returned ("fetched under the old
    assignment"). But the fetch was made under the *new* assignment, from the committed offset,
    and returning it moved the consumer's position past it: the next read starts after it, the
    redrive copies the records after the dropped batch and commits past the dropped ones. They are
    never copied, and no later redrive reads them: lost.

    The test lets the rebalance (a real one: a second member joins the group, subscribed to another
    topic, so the redrive keeps its partition) complete inside the redrive's first fetch.
    """
    from aiokafka import AIOKafkaConsumer as Consumer

    from airflow_shared_stream.kafka.redrive_membership import RedriveMembership

    dlq, origin = await topics(kafka)
    other = kafka.name("other")
    await kafka.create_topics(other)
    await dead_letters(kafka, dlq, origin, 10)
    group = default_group_id(dlq, origin)
    joiner = AIOKafkaConsumer(bootstrap_servers=kafka.bootstrap, group_id=group, enable_auto_commit=False)
    real_getmany = Consumer.getmany
    state = {"armed": True}

    async def getmany_across_a_rebalance(self: Consumer, *partitions: object, **kwargs: object) -> object:
        membership = self._subscription.listener
        if state["armed"] and isinstance(membership, RedriveMembership):
            state["armed"] = False
            before = membership.epoch
            await joiner.start()
            joiner.subscribe([other])
            await membership.wait_reassigned(before)  # the rebalance goes by while this fetch waits
        return await real_getmany(self, *partitions, **kwargs)

    monkeypatch.setattr(Consumer, "getmany", getmany_across_a_rebalance)
    try:
        summary = await asyncio.wait_for(redrive(source(kafka, dlq, source=origin), batch_size=5), 120)
    finally:
        await joiner.stop()

    at_origin = len(await kafka.read_all(origin, 11, timeout_ms=2000))
    committed = (await kafka.committed(group, dlq))[0]
    assert at_origin == 10 or (committed or 0) < 10, (
        f"moved {summary.moved}, {at_origin} at the origin, and the group committed {committed}: "
        f"{10 - at_origin} record(s) passed without a copy"
    )
