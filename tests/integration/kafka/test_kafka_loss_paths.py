"""
Regression tests for the Kafka message-loss paths, against noida-db and Tansu.

Each test names the item it guards. They are written as a user meets the problem: real
brokers, the real manager (through the harness), the connection settings a deployment uses
(``auto.offset.reset`` left at ``latest``, a ``group.id`` in the connection), and an assertion on
which messages a watcher saw, not on internals.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.coordinator.assignors.range import RangePartitionAssignor
from aiokafka.record.default_records import DefaultRecordBatchBuilder

from airflow_shared_stream.kafka import KafkaSharedStreamTrigger
from airflow_shared_stream.testing import SharedStreamHarness

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

LATEST = {"auto.offset.reset": "latest"}


async def probe_until_seen(kafka, topic, watcher, timeout=40.0) -> None:
    """
    Produce probe records until the watcher sees one: proof its consumer is assigned and reading.

    With ``auto.offset.reset=latest`` a record produced before the consumer has its partitions is
    (rightly) never read, so a test cannot simply produce once and wait.
    """
    deadline = asyncio.get_running_loop().time() + timeout
    for n in itertools.count():
        await kafka.produce(topic, [f"probe-{n}"])
        with contextlib.suppress(TimeoutError):
            await watcher.wait_for_events(1, timeout=1.0)
            return
        assert asyncio.get_running_loop().time() < deadline, "the consumer never read a probe"


async def settle(watcher, count: int, quiet: float = 1.5) -> list:
    """Wait for ``count`` events, then a little longer, so extra (duplicate) events would show."""
    await watcher.wait_for_events(count, timeout=60)
    await asyncio.sleep(quiet)
    return [p["value"] for p in watcher.payloads]


# -- tuning arguments never change the consumer group --------------------------------


async def test_changing_tuning_arguments_keeps_the_group_and_its_position(kafka):
    """a redeploy with other tuning resumes the same group, nothing skipped."""
    topic, dlq = kafka.name("t"), kafka.name("dlq")
    await kafka.create_topics(topic, dlq)
    conn = kafka.connection("latest", **LATEST)
    async with SharedStreamHarness(confirm_after=0.0) as h:
        w = h.add(KafkaSharedStreamTrigger([topic], kafka_config_id=conn))
        await probe_until_seen(kafka, topic, w)
        seen = len(w.payloads)
        await asyncio.sleep(1.0)  # the commit task coalesces commits every 0.2 s
        assert len(w.payloads) == seen

    # Produced while the stream is down for the redeploy.
    await kafka.produce(topic, [f"down-{i}" for i in range(5)])
    retuned = KafkaSharedStreamTrigger(
        [topic], kafka_config_id=conn, max_in_flight=7, max_payload_bytes=5000, dead_letter_topic=dlq
    )
    async with SharedStreamHarness(confirm_after=0.0) as h:
        w = h.add(retuned)
        assert await settle(w, 5) == [f"down-{i}" for i in range(5)]


# -- a group that never committed starts where it first started --------------------


async def test_first_start_position_is_committed_and_survives_a_restart(kafka):
    """nothing produced after a stream first started is skipped by a restart."""
    topic = kafka.name("t")
    await kafka.create_topics(topic)
    conn = kafka.connection("latest", **LATEST)
    group = kafka.name("g")
    trigger = KafkaSharedStreamTrigger([topic], kafka_config_id=conn, group_id=group)
    async with SharedStreamHarness(confirm_after=None) as h:
        w = h.add(trigger)
        # The starting position is committed as soon as the partition is assigned, before any
        # record arrives: a quiet topic must not leave the group without a position.
        assert await kafka.wait_committed(group, topic, {0: 0}, timeout=30) == {0: 0}
        # Read while it runs, never persisted: held, so it must come back after the restart.
        await kafka.produce(topic, ["held"])
        await w.wait_for_events(1)
        assert [p["value"] for p in w.payloads] == ["held"]

    await kafka.produce(topic, [f"down-{i}" for i in range(3)])
    async with SharedStreamHarness(confirm_after=0.0) as h:
        w = h.add(trigger)
        assert await settle(w, 4) == ["held", "down-0", "down-1", "down-2"]
        assert await kafka.wait_committed(group, topic, {0: 4}) == {0: 4}


async def test_a_record_read_but_never_persisted_is_not_committed_when_the_stream_closes(kafka):
    """
    the stream's group commits only what was persisted, never what was merely read.

    An aiokafka consumer left at its default ``enable_auto_commit=True`` commits every record it
    read, on its interval and once more when it stops; closing the stream is that stop.
    """
    topic = kafka.name("t")
    await kafka.create_topics(topic)
    conn = kafka.connection("latest", **LATEST)
    group = kafka.name("g")
    trigger = KafkaSharedStreamTrigger([topic], kafka_config_id=conn, group_id=group)
    async with SharedStreamHarness(confirm_after=None) as h:
        w = h.add(trigger)
        assert await kafka.wait_committed(group, topic, {0: 0}, timeout=30) == {0: 0}
        await kafka.produce(topic, ["read, never persisted"])
        await w.wait_for_events(1)
    # The stream has closed: its consumer stopped, and nothing past the unpersisted record moved.
    assert await kafka.committed(group, topic) == {0: 0}


# -- no two different streams share a consumer group ---------------------------------


async def test_connection_group_id_never_splits_one_topic_between_streams(kafka):
    """a connection ``group.id`` does not put two streams into one group."""
    topic, other = kafka.name("t"), kafka.name("other")
    await kafka.create_topics(topic, partitions=4)
    await kafka.create_topics(other)
    conn = kafka.connection(
        "grouped", **{"group.id": kafka.name("team-group"), "auto.offset.reset": "earliest"}
    )
    values = [f"m{p}-{i}" for p in range(4) for i in range(5)]
    for p in range(4):
        await kafka.produce(topic, [f"m{p}-{i}" for i in range(5)], partition=p)
    async with SharedStreamHarness(confirm_after=0.0) as h:
        # Two different upstreams (one topic; that topic and another) on one connection.
        only_topic = h.add(KafkaSharedStreamTrigger([topic], kafka_config_id=conn))
        both = h.add(KafkaSharedStreamTrigger([topic, other], kafka_config_id=conn))
        await only_topic.wait_for_events(20, timeout=60)
        await both.wait_for_events(20, timeout=60)
        assert sorted(p["value"] for p in only_topic.payloads) == sorted(values)
        assert sorted(p["value"] for p in both.payloads if p["topic"] == topic) == sorted(values)


async def test_watchers_disagreeing_on_tuning_share_nothing_silently(kafka):
    """the same upstream is never split between consumers."""
    topic = kafka.name("t")
    await kafka.create_topics(topic, partitions=4)
    conn = kafka.connection(
        "grouped", **{"group.id": kafka.name("team-group"), "auto.offset.reset": "earliest"}
    )
    for p in range(4):
        await kafka.produce(topic, [f"m{p}-{i}" for i in range(5)], partition=p)
    async with SharedStreamHarness(confirm_after=0.0) as h:
        first = h.add(KafkaSharedStreamTrigger([topic], kafka_config_id=conn, max_in_flight=100))
        await first.wait_for_events(1, timeout=60)
        second = h.add(KafkaSharedStreamTrigger([topic], kafka_config_id=conn, max_in_flight=200))
        error = await second.wait_for_error(timeout=60)
        assert "max_in_flight" in str(error)
        await first.wait_for_events(20, timeout=60)
        assert len({(p["partition"], p["offset"]) for p in first.payloads}) == 20
        assert first.error is None


async def test_one_explicit_group_id_for_two_streams_fails_loudly(kafka):
    """an explicit group_id shared by two different streams is refused."""
    topic, other = kafka.name("t"), kafka.name("other")
    await kafka.create_topics(topic, other)
    group = kafka.name("g")
    async with SharedStreamHarness(confirm_after=0.0) as h:
        first = h.add(KafkaSharedStreamTrigger([topic], kafka_config_id=kafka.conn_id, group_id=group))
        await kafka.produce(topic, ["a"])
        await first.wait_for_events(1, timeout=60)
        second = h.add(
            KafkaSharedStreamTrigger([topic, other], kafka_config_id=kafka.conn_id, group_id=group)
        )
        error = await second.wait_for_error(timeout=60)
        assert group in str(error)
        assert "another stream" in str(error)


# Tansu only: on noida-db 0.2.3 a consumer that joins a group after another test of the session
# rejoins generation 2 forever (the broker's coordinator); Tansu runs the join to the end.
@pytest.mark.parametrize("kafka_broker", ["tansu"], indirect=True)
async def test_a_member_of_another_stream_in_the_group_takes_nothing_from_the_stream(kafka):
    """
    Across triggerers: a consumer of another stream that joins the
    stream's group by mistake (another triggerer, another tool) cannot take partitions away: the
    stream reads every partition by assignment and never joins its group.
    """
    topic, other = kafka.name("t"), kafka.name("other")
    await kafka.create_topics(topic, partitions=2)
    await kafka.create_topics(other)
    group = kafka.name("g")
    async with SharedStreamHarness(confirm_after=0.0) as h:
        ours = h.add(KafkaSharedStreamTrigger([topic], kafka_config_id=kafka.conn_id, group_id=group))
        await probe_until_seen(kafka, topic, ours)
        stranger = AIOKafkaConsumer(
            topic,
            other,
            bootstrap_servers=kafka.bootstrap,
            group_id=group,
            enable_auto_commit=False,
            partition_assignment_strategy=(RangePartitionAssignor,),  # aiokafka's default
        )
        await stranger.start()
        polling = asyncio.create_task(_poll_forever(stranger))
        try:
            await asyncio.wait_for(_until_assigned(stranger), 60)
            before = len(ours.payloads)
            for p in range(2):
                await kafka.produce(topic, [f"after-{p}-{i}" for i in range(5)], partition=p)
            await ours.wait_for_events(before + 10, timeout=60)
        finally:
            polling.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await polling
            await stranger.stop()
        got = sorted(p["value"] for p in ours.payloads[before:])
        assert got == sorted(f"after-{p}-{i}" for p in range(2) for i in range(5))
        assert ours.error is None


async def _until_assigned(consumer) -> None:
    while not consumer.assignment():  # noqa: ASYNC110 - aiokafka offers no assignment event
        await asyncio.sleep(0.1)


async def _poll_forever(consumer) -> None:
    while True:
        await consumer.getmany(timeout_ms=200)


# -- a record too large for the dead-letter topic still leaves the stream -------------


ORIGIN = (("x-shared-stream-topic", b"t" * 40), ("x-shared-stream-partition", b"0"),
          ("x-shared-stream-offset", b"0" * 12))  # fmt: skip
LIMIT = 1048576  # aiokafka's (and Kafka's) default max.request.size / message.max.bytes


def value_that_fits_only_without_origin_headers(headers: list[tuple[str, bytes]]) -> bytes:
    """A value whose record fits the 1 MiB limit, but not once the origin headers are added."""
    size = LIMIT - 100
    while DefaultRecordBatchBuilder.estimate_size_in_bytes(b"k", b"x" * (size + 1), headers) <= LIMIT:
        size += 1
    value = b"x" * size
    assert DefaultRecordBatchBuilder.estimate_size_in_bytes(b"k", value, headers) <= LIMIT
    assert DefaultRecordBatchBuilder.estimate_size_in_bytes(b"k", value, [*headers, *ORIGIN]) > LIMIT
    return value


async def test_record_too_large_for_the_dead_letter_topic_still_leaves_the_stream(kafka):
    """a dead letter over the size limit becomes a pointer; the stream goes on."""
    topic, dlq = kafka.name("t"), kafka.name("dlq")
    await kafka.create_topics(topic, dlq)
    group = kafka.name("g")
    headers = [("trace", b"abc")]
    big = value_that_fits_only_without_origin_headers(headers)
    producer = AIOKafkaProducer(bootstrap_servers=kafka.bootstrap, acks="all")
    await producer.start()
    try:
        await producer.send_and_wait(topic, value=big, key=b"k", headers=headers)
    finally:
        await producer.stop()
    await kafka.produce(topic, ["after"])
    trigger = KafkaSharedStreamTrigger(
        [topic], kafka_config_id=kafka.conn_id, group_id=group, dead_letter_topic=dlq
    )
    async with SharedStreamHarness(confirm_after=0.0) as h:
        w = h.add(trigger)
        await w.wait_for_events(1, timeout=60)
        assert [p["value"] for p in w.payloads] == ["after"]
        assert await kafka.wait_committed(group, topic, {0: 2}) == {0: 2}
        assert w.error is None
    (pointer,) = await kafka.read_all(dlq, expected=1)
    assert pointer.value is None
    assert pointer.key == b"k"
    fields = dict(pointer.headers)
    assert fields["x-shared-stream-topic"] == topic.encode()
    assert fields["x-shared-stream-offset"] == b"0"
    assert b"too large" in fields["x-shared-stream-dead-letter-reason"]
    assert int(fields["x-shared-stream-original-size"]) > len(big)


# -- a full credit window does not cost the consumer its group membership ------------


async def test_full_credit_window_keeps_the_consumer_in_its_group(kafka):
    """waiting for credit longer than max.poll.interval.ms loses nothing."""
    topic = kafka.name("t")
    await kafka.create_topics(topic)
    group = kafka.name("g")
    short_poll = {
        "max.poll.interval.ms": "2000",
        "session.timeout.ms": "10000",
        "heartbeat.interval.ms": "500",
    }
    conn = kafka.connection("short_poll", **{"auto.offset.reset": "earliest", **short_poll})
    await kafka.produce(topic, [f"m{i}" for i in range(6)])
    trigger = KafkaSharedStreamTrigger([topic], kafka_config_id=conn, group_id=group, max_in_flight=2)
    async with SharedStreamHarness(confirm_after=None) as h:
        w = h.add(trigger)
        await w.wait_for_events(2, timeout=60)
        # A metadata database slower than max.poll.interval.ms: the window stays full meanwhile.
        await asyncio.sleep(5)
        h.confirm_after = 0.0
        h.confirm()
        assert await kafka.wait_committed(group, topic, {0: 6}, timeout=40) == {0: 6}
        await asyncio.sleep(1.0)
        # Every message exactly once: no rebalance made the first two stale and re-read.
        assert [p["offset"] for p in w.payloads] == list(range(6))


# -- records of aborted transactions never fire ---------------------------------------


@pytest.mark.parametrize("kafka_broker", ["noida-db"], indirect=True)  # Tansu has no transactions
async def test_aborted_transactions_are_not_read_by_default(kafka):
    """isolation.level defaults to read_committed (librdkafka's default)."""
    topic = kafka.name("t")
    await kafka.create_topics(topic)
    producer = AIOKafkaProducer(bootstrap_servers=kafka.bootstrap, transactional_id=kafka.name("tx"))
    await producer.start()
    try:
        async with producer.transaction():
            await producer.send_and_wait(topic, b"committed-1")
        await producer.begin_transaction()
        await producer.send_and_wait(topic, b"aborted")
        await producer.abort_transaction()
        async with producer.transaction():
            await producer.send_and_wait(topic, b"committed-2")
    finally:
        await producer.stop()
    async with SharedStreamHarness(confirm_after=0.0) as h:
        w = h.add(KafkaSharedStreamTrigger([topic], kafka_config_id=kafka.conn_id, group_id=kafka.name("g")))
        assert await settle(w, 2) == ["committed-1", "committed-2"]
