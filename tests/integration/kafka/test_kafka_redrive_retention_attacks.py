"""
A Kafka redrive's commits as its group's member, with a retention of their own (issue 45, commit
97710fd: ``RedriveMembership.commit``, ``PositionStore.commit_asking_again``), attacked with
FAULT_MODEL classes 1, 5, 6, 8, 11, 12 and 15 on real Kafka-protocol brokers.

Each test says what it shows; a break is a strict ``xfail`` until it is fixed.
"""

from __future__ import annotations

import asyncio
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
    dead letters". Fixed: each assignment commits the group's offsets on what it gives again, with
    the redrive's retention.

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


async def test_a_batch_longer_than_the_poll_interval_does_not_stall_the_redrive(
    kafka: KafkaSandbox, monkeypatch: pytest.MonkeyPatch
) -> None:
    """
    FAULT_MODEL 5 (the redrive's partitions are a lease the coordinator can move: a lost lease means
    a duplicate, never a stall or a failed redrive) and 15 (an operator action). Another member
    joins the redrive group while the redrive copies a batch (a second redrive, a dry run; here one
    subscribed to another topic, so the redrive keeps its partition), and the batch takes longer
    than ``max.poll.interval.ms`` (the connection's, which the stream shares; a slow origin, a big
    batch). The coordinator completes the rebalance without the redrive (Kafka's rebalance timeout
    is that interval; aiokafka's heartbeat leaves the group itself once ``getmany`` was not called
    for it). ``RedriveMembership.commit`` is fenced and waits for its reassignment, but aiokafka
    joins again only after the next ``getmany`` ("no activity on consumer"), which the redrive
    never calls while it waits: it waits ``ASSIGNMENT_TIMEOUT_SECONDS`` (ten minutes) and fails the
    redrive (the Dag run fails, the retry copies the batch again). The same holds before a first
    fence: ``read`` waits for an assignment without polling too. And the fence came after the
    revocation began (the epoch had moved on already), so the commit waited for a rebalance after
    that one. Fixed: a wait for an assignment counts as the consumer's activity, and a revocation
    under way is the rebalance a fenced commit waits for.
    """
    from aiokafka import AIOKafkaConsumer

    from airflow_shared_stream.kafka.redrive import KafkaDeadLetterSource
    from airflow_shared_stream.redrive import dead_letter_source
    from tests.integration.kafka.test_kafka_redrive import dead_letters, topics

    dlq, origin = await topics(kafka)
    other = kafka.name("other")
    await kafka.create_topics(other)
    await dead_letters(kafka, dlq, origin, 10)
    group = default_group_id(dlq, origin)
    conn_id = kafka.connection(
        "short",
        **{"max.poll.interval.ms": "6000", "session.timeout.ms": "6000", "heartbeat.interval.ms": "1000"},
    )
    joiner = AIOKafkaConsumer(
        bootstrap_servers=kafka.bootstrap,
        group_id=group,
        enable_auto_commit=False,
        session_timeout_ms=6000,
        max_poll_interval_ms=6000,
        heartbeat_interval_ms=1000,
    )
    real_copy = KafkaDeadLetterSource.copy
    state = {"armed": True, "out": False}
    polling: list[asyncio.Task[None]] = []

    async def poll_joiner() -> None:
        while True:
            await joiner.getmany(timeout_ms=200)

    async def copy_past_the_rebalance_timeout(self: KafkaDeadLetterSource, items: object) -> object:
        if state["armed"]:
            state["armed"] = False
            membership, consumer = self._membership, self._consumer
            assert membership is not None
            assert consumer is not None
            epoch = membership.epoch
            await joiner.start()
            joiner.subscribe([other])
            polling.append(asyncio.create_task(poll_joiner()))
            while membership.epoch == epoch:  # noqa: ASYNC110 (no event of its own): the revocation began
                await asyncio.sleep(0.05)
            loop = asyncio.get_running_loop()
            until = loop.time() + 30
            while loop.time() < until:  # the coordinator goes on without it (noida-db never does)
                if joiner.assignment() or consumer._coordinator.generation == -1:
                    state["out"] = True
                    break
                await asyncio.sleep(0.1)
        return await real_copy(self, items)

    monkeypatch.setattr(KafkaDeadLetterSource, "copy", copy_past_the_rebalance_timeout)
    try:
        try:
            summary = await asyncio.wait_for(
                redrive(
                    dead_letter_source("kafka", source=origin, dead_letter=dlq, conn_id=conn_id), batch_size=5
                ),
                90,
            )
        except TimeoutError:
            pytest.fail(
                f"the redrive still waited 90 s after its fenced commit (out of the group: {state['out']}); "
                "it waits ASSIGNMENT_TIMEOUT_SECONDS for a rebalance that already happened"
            )
    finally:
        for task in polling:
            task.cancel()
        await joiner.stop()
    assert summary.moved == 10, summary
    assert await kafka.committed(group, dlq) == {0: 10}


async def test_a_fenced_answer_to_the_last_commit_attempt_is_a_failed_commit(
    kafka: KafkaSandbox, monkeypatch: pytest.MonkeyPatch
) -> None:
    """
    FAULT_MODEL 5 (a lost lease is a redelivery, never a failure) and 14's request-level errors.
    ``PositionStore.commit_asking_again`` asks again while the coordinator is loading or moved
    (Kafka answers ``NOT_COORDINATOR`` while a group's coordinator moves; the test brokers never do,
    FIDELITY: the test answers it for them for the first attempts), and maps a fenced answer
    (``UNKNOWN_MEMBER_ID``, ``ILLEGAL_GENERATION``, ``REBALANCE_IN_PROGRESS``) to
    ``CommitFailedError``, on which ``RedriveMembership.commit`` waits for the rebalance and commits
    what it still holds. Its last attempt goes out unguarded: when the coordinator is back by then
    and the group rebalanced meanwhile (likely: a moved coordinator makes every member rejoin), the
    real broker's fenced answer came out as ``UnknownMemberIdError`` and the redrive failed. Fixed.
    """
    from aiokafka import AIOKafkaConsumer, TopicPartition
    from aiokafka.client import AIOKafkaClient
    from aiokafka.errors import CommitFailedError
    from aiokafka.protocol.commit import OffsetCommitRequest

    from airflow_shared_stream.kafka import positions
    from airflow_shared_stream.kafka.positions import GroupMember, PositionStore

    dlq = kafka.name("dlq")
    await kafka.create_topics(dlq)
    group = kafka.name("group")
    member = AIOKafkaConsumer(bootstrap_servers=kafka.bootstrap, group_id=group, enable_auto_commit=False)
    await member.start()
    try:
        member.subscribe([dlq])
        while not member.assignment():
            await member.getmany(timeout_ms=200)
        gone = GroupMember(member._coordinator.generation, "a-member-the-group-put-out")

        send = AIOKafkaClient.send
        moved = {"left": positions.FETCH_ATTEMPTS - 1}

        class NotCoordinator:
            def __init__(self, request: OffsetCommitRequest) -> None:
                self.topics = [(t, [(p, 16) for p, *_ in parts]) for t, parts in request._topics]

        async def coordinator_moving(
            client: AIOKafkaClient, node_id: object, request: object, **kw: object
        ) -> object:
            if (
                isinstance(request, OffsetCommitRequest)
                and request._consumer_group == group
                and moved["left"]
            ):
                moved["left"] -= 1
                return NotCoordinator(request)  # NOT_COORDINATOR, what Kafka answers while it moves
            return await send(client, node_id, request, **kw)

        monkeypatch.setattr(AIOKafkaClient, "send", coordinator_moving)
        monkeypatch.setattr(positions, "FETCH_BACKOFF", (0.01, 0.01))
        with pytest.raises(CommitFailedError):
            await PositionStore(member._client).commit_asking_again(
                group, {TopicPartition(dlq, 0): 1}, member=gone, retention_ms=60_000
            )
        assert moved["left"] == 0
    finally:
        await member.stop()
