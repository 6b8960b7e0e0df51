"""
Attacks on issue 46's cluster-change handling (FAULT_MODEL classes 3, 11, 14), on real brokers.

Each test is one way the cluster can change under a stream that the change was reviewed against:
retention passing a running consumer's position, a topic re-created while no stream runs, a topic
re-created with fewer partitions. Each :class:`SharedStreamHarness` is one triggerer.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

import pytest
from aiokafka import TopicPartition
from aiokafka.admin import RecordsToDelete

from airflow_shared_stream.kafka import cluster_watch
from airflow_shared_stream.kafka.committer import OffsetCommitter
from airflow_shared_stream.kafka.topic_memory import MEMORY_KEY_PREFIX
from airflow_shared_stream.kafka.trigger import KafkaSharedStreamTrigger
from airflow_shared_stream.kafka.watchers import watcher_group_id
from airflow_shared_stream.testing import InMemoryStateStore, SharedStreamHarness
from tests.integration.kafka.test_kafka_cluster_changes import _admin, _received_up_to, _until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

POSITIONS_LOG = "airflow_shared_stream.kafka"


def _remembers(store: InMemoryStateStore) -> bool:
    """Whether a stream wrote its memory of topic ids to ``store`` (figures go there too)."""
    return any(key.startswith(MEMORY_KEY_PREFIX) for key in store.values)


async def _produce_one_by_one(kafka: Any, topic: str, values: list[dict[str, Any]]) -> None:
    """One record batch per record, so a small fetch size reads them one at a time."""
    for value in values:
        await kafka.produce(topic, [value])


@pytest.mark.parametrize("kafka_broker", ["noida-db"], indirect=True)  # Tansu: no DeleteRecords
async def test_retention_passing_a_running_streams_read_position_moves_it_to_the_log_start(kafka, caplog):
    """
    Class 14 / 11 (item 5 while running). The stream reads slowly (two in flight, nothing
    persisted yet): records 0-2 came in one fetch, 0 and 1 are in flight and 2 waits in the
    client's buffer (a partition with buffered records is not fetched again), when 3-29 are
    produced and retention deletes 0-19. Its next fetch, at 3, is out of range: the client resets
    to ``auto.offset.reset=latest`` (logged at INFO), so 20-29, which retention kept, are never
    delivered and the watcher's position stays at 3 for as long as the stream runs. They must be
    read from the log start (20), said at WARNING.

    Records 3-29 are produced only once 0-2 were fetched: noida-db and Tansu answer a fetch with
    every record they have, whatever ``max.partition.fetch.bytes`` (Kafka stops after the first
    batch above it), so a fetch at 2 made after 3-29 exist would buffer them all before the
    deletion. The test used to produce 0-29 one record at a time and rely on noida-db answering
    empty fetches at once to read each as it came; holding those fetches as Kafka does (100 ms)
    made it fail about one run in two, with 2-19 read before retention took them.
    """
    caplog.set_level(logging.INFO, logger=POSITIONS_LOG)
    topic = kafka.name("t")
    await kafka.create_topics(topic)
    group = kafka.name("g")
    conn = kafka.connection("slow", **{"auto.offset.reset": "latest", "max.partition.fetch.bytes": "64"})
    trigger = KafkaSharedStreamTrigger([topic], kafka_config_id=conn, group_id=group, max_in_flight=2)
    own_group = watcher_group_id(group, trigger.watcher_digest())
    async with SharedStreamHarness(confirm_after=None) as triggerer:
        w = triggerer.add(trigger)
        assert await kafka.wait_committed(own_group, topic, {0: 0}) == {0: 0}
        await kafka.produce(topic, [{"i": i} for i in range(3)])  # one batch: one fetch takes 0-2
        await w.wait_for_events(2)
        await _produce_one_by_one(kafka, topic, [{"i": i} for i in range(3, 30)])
        tp = TopicPartition(topic, 0)
        await _admin(kafka, lambda admin: admin.delete_records({tp: RecordsToDelete(20)}))
        triggerer.confirm_after = 0.0  # persistence resumes: the stream reads on
        triggerer.confirm()
        await kafka.produce(topic, [{"i": 30}])
        received = await _received_up_to(w, 30)
        assert set(range(20, 30)) <= set(received), f"records retention kept were skipped: {received}"
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("retention" in message for message in warnings), warnings


@pytest.mark.parametrize("reset", ["earliest", "latest"])
@pytest.mark.parametrize("kafka_broker", ["tansu", "noida-db"], indirect=True)
async def test_a_topic_created_again_while_no_stream_runs_is_read_from_its_start(kafka, reset, caplog):
    """
    Class 11 / 14. The stream read 20 records and stopped; the topic was deleted, created again
    and given 25 records (offsets 0-24) while no stream ran. Kafka deletes a deleted topic's
    committed offsets (Tansu too; noida-db keeps them, so the test deletes them there, its Kafka
    mode), so the stream and its watcher start without a position: with ``latest`` all 25 were
    skipped with no WARNING. The stream's memory of the topic id it committed on (kept in the
    asset state store, shared by the two harnesses as by two triggerer runs) shows the topic is
    new: it is read from its start. noida-db has no topic ids, so the service cannot tell this
    from positions that expired (which by design start at the read position): there the skip
    must be said at WARNING, naming the topic and the offsets.
    """
    caplog.set_level(logging.INFO, logger=POSITIONS_LOG)
    topic = kafka.name("t")
    await kafka.create_topics(topic)
    group = kafka.name("g")
    conn = kafka.connection(reset, **{"auto.offset.reset": reset})
    trigger = KafkaSharedStreamTrigger([topic], kafka_config_id=conn, group_id=group)
    own_group = watcher_group_id(group, trigger.watcher_digest())
    state_store = InMemoryStateStore()
    async with SharedStreamHarness(confirm_after=0.0, state_store=state_store) as triggerer:
        w = triggerer.add(trigger)
        assert await kafka.wait_committed(own_group, topic, {0: 0}) == {0: 0}
        await kafka.produce(topic, [{"round": 1, "i": i} for i in range(20)])
        await w.wait_for_events(20)
        assert await kafka.wait_committed(own_group, topic, {0: 20}) == {0: 20}
        await _until(lambda: _remembers(state_store), "the stream's memory of its topic ids")
    await kafka.delete_topic(topic, groups=(group, own_group))
    await kafka.create_topics(topic)
    await kafka.produce(topic, [{"round": 2, "i": i} for i in range(25)])
    caplog.clear()
    async with SharedStreamHarness(confirm_after=0.0, state_store=state_store) as restarted:
        again = restarted.add(trigger)
        for _ in range(200):  # the restart places the watcher (commits its start) first
            if (await kafka.committed(own_group, topic)).get(0) is not None:
                break
            await asyncio.sleep(0.1)
        await kafka.produce(topic, [{"round": 2, "i": 25}])
        received = await _received_up_to(again, 25)
        if kafka.broker.name == "noida-db" and reset == "latest":
            warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
            assert any(topic in m and "0: 0-24" in m and "cannot tell" in m for m in warnings), warnings
            return
        assert received == list(range(26)), f"the new topic's first records were skipped: {received}"


@pytest.mark.parametrize("kafka_broker", ["tansu"], indirect=True)  # noida-db: no topic ids
async def test_a_topic_created_again_with_fewer_partitions_is_read_from_its_start(kafka, monkeypatch):
    """
    Class 14 (the authors' known gap: partitions removed by a re-creation). A two-partition topic
    is deleted while the stream runs and created again with one partition and 25 records. The
    stream must read all 25 from the start of partition 0, without failing for the partition that
    no longer exists and without forgetting (on its retry) that the topic is new.
    """
    monkeypatch.setattr(cluster_watch, "CLUSTER_CHECK_INTERVAL", 0.2)
    checking = asyncio.Event()
    checking.set()
    due = cluster_watch.ClusterWatch.due
    monkeypatch.setattr(cluster_watch.ClusterWatch, "due", lambda watch: checking.is_set() and due(watch))
    topic = kafka.name("t")
    await kafka.create_topics(topic, partitions=2)
    group = kafka.name("g")
    trigger = KafkaSharedStreamTrigger([topic], kafka_config_id=kafka.conn_id, group_id=group)
    own_group = watcher_group_id(group, trigger.watcher_digest())
    async with SharedStreamHarness(confirm_after=0.0) as triggerer:
        w = triggerer.add(trigger)
        await kafka.produce(topic, [{"round": 1, "i": i} for i in range(20)], partition=0)
        await kafka.produce(topic, [{"round": 1, "i": 100}], partition=1)
        await w.wait_for_events(21)
        assert await kafka.wait_committed(own_group, topic, {0: 20, 1: 1}, partitions=2) == {0: 20, 1: 1}
        checking.clear()
        await _admin(kafka, lambda admin: admin.delete_topics([topic]))
        await kafka.create_topics(topic, partitions=1)
        await kafka.produce(topic, [{"round": 2, "i": i} for i in range(25)], partition=0)
        checking.set()

        def second() -> list[int]:
            return [p["value"]["i"] for p in w.payloads if p["value"]["round"] == 2]

        with contextlib.suppress(AssertionError):
            await _until(lambda: set(second()) >= set(range(25)), "the new topic's records", timeout=30)
        assert set(second()) == set(range(25)), f"the new topic's first records were skipped: {second()}"
        assert w.error is None, w.error


@pytest.mark.parametrize("kafka_broker", ["noida-db"], indirect=True)  # Tansu: no DeleteRecords
async def test_a_seek_back_below_the_log_start_reads_on_from_it_and_commits_again(kafka, caplog):
    """
    Class 14 (the authors' known gap: a seek-back below the log start falls to
    ``auto.offset.reset``). A watcher hangs on record 0 and the ack timeout fails it: records 0-1
    are redelivered from 0, but retention deleted 0-19 meanwhile. The client resets the seek to
    ``latest``: the healthy watcher never gets 20-29, and the floor held at 0 is never read again,
    so neither the stream's nor the healthy watcher's position is committed again while the
    stream runs. The seek must land on the log start, the floor lift, and positions move on.
    """
    caplog.set_level(logging.INFO, logger=POSITIONS_LOG)
    topic = kafka.name("t")
    await kafka.create_topics(topic)
    group = kafka.name("g")
    conn = kafka.connection("slow", **{"auto.offset.reset": "latest", "max.partition.fetch.bytes": "64"})

    def watcher(name: str) -> KafkaSharedStreamTrigger:
        return KafkaSharedStreamTrigger(
            [topic], kafka_config_id=conn, group_id=group, max_in_flight=2, match=f"'{name}' != 'never'"
        )

    healthy, stuck = watcher("healthy"), watcher("stuck")
    healthy_group = watcher_group_id(group, healthy.watcher_digest())
    release = asyncio.Event()
    holding = asyncio.Event()

    async def hang(event: Any) -> None:
        holding.set()
        await release.wait()

    async with SharedStreamHarness(confirm_after=0.0, ack_timeout=3.0) as h:
        a = h.add(healthy)
        b = h.add(stuck, before_bind=hang)
        assert await kafka.wait_committed(healthy_group, topic, {0: 0}) == {0: 0}
        await _produce_one_by_one(kafka, topic, [{"i": i} for i in range(30)])
        await asyncio.wait_for(holding.wait(), 20)
        tp = TopicPartition(topic, 0)
        await _admin(kafka, lambda admin: admin.delete_records({tp: RecordsToDelete(20)}))
        await _until(lambda: any("Redelivering" in r.getMessage() for r in caplog.records), "the redelivery")
        release.set()
        await b.wait_for_error(timeout=30)
        await kafka.produce(topic, [{"i": 30}])
        received = await _received_up_to(a, 30)
        assert set(range(20, 30)) <= set(received), f"records retention kept were skipped: {received}"
        assert await kafka.wait_committed(healthy_group, topic, {0: 31}) == {0: 31}
        assert await kafka.wait_committed(group, topic, {0: 31}) == {0: 31}
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("retention" in message for message in warnings), warnings


@pytest.mark.parametrize("kafka_broker", ["noida-db"], indirect=True)  # Tansu: no CreatePartitions
async def test_partitions_added_twice_quickly_are_all_read_from_their_start(kafka, monkeypatch):
    """
    Class 14: partitions added twice in quick succession (1 -> 2 -> 3), records produced to each
    new partition at once, with ``auto.offset.reset=latest``. Every record of both added
    partitions is read, and every watcher position lands at their ends.
    """
    from aiokafka.admin import NewPartitions

    monkeypatch.setattr(cluster_watch, "CLUSTER_CHECK_INTERVAL", 0.2)
    topic = kafka.name("t")
    await kafka.create_topics(topic)
    group = kafka.name("g")
    conn = kafka.connection("latest", **{"auto.offset.reset": "latest"})
    trigger = KafkaSharedStreamTrigger([topic], kafka_config_id=conn, group_id=group)
    own_group = watcher_group_id(group, trigger.watcher_digest())
    async with SharedStreamHarness(confirm_after=0.0) as triggerer:
        w = triggerer.add(trigger)
        assert await kafka.wait_committed(own_group, topic, {0: 0}) == {0: 0}
        await _admin(kafka, lambda admin: admin.create_partitions({topic: NewPartitions(2)}))
        await kafka.produce(topic, [{"p": 1, "i": i} for i in range(3)], partition=1)
        await _admin(kafka, lambda admin: admin.create_partitions({topic: NewPartitions(3)}))
        await kafka.produce(topic, [{"p": 2, "i": i} for i in range(4)], partition=2)
        await kafka.produce(topic, [{"p": 1, "i": 3}], partition=1)
        with contextlib.suppress(AssertionError):
            await _until(lambda: len(w.payloads) >= 8, "eight records", timeout=20)
        got = sorted((p["value"]["p"], p["value"]["i"]) for p in w.payloads)
        assert got == [(1, i) for i in range(4)] + [(2, i) for i in range(4)], got
        assert await kafka.wait_committed(own_group, topic, {0: 0, 1: 4, 2: 4}, partitions=3) == {
            0: 0,
            1: 4,
            2: 4,
        }


@pytest.mark.parametrize("kafka_broker", ["tansu"], indirect=True)  # the broker with topic ids
async def test_a_stream_stopped_before_it_detects_a_re_created_topic_reads_it_from_its_start(
    kafka, monkeypatch
):
    """
    Class 3 / 14: restart between a re-creation and its detection. The stream read 20 records;
    the topic is deleted, created again and given 25 records, and the stream's periodic check
    (every 5 s) is held off: it reads 20-24 of the new topic at its old position. It used to
    commit 25 there, so its restart, comparing topic ids only with what it found at start, kept
    position 25 and never read the new topic's records 0-19. Now a commit round reads the ids
    first and commits nothing on a topic whose id changed (the watcher's position on the new topic
    stays unset), and the restart, finding the stream's memory of the old id (the asset state
    store, shared by both runs), reads the new topic from its start: 0-19 reach the watcher.
    With ``auto.offset.reset=latest``, so the restart depends on both (with ``earliest`` the
    commit check alone would do).
    """
    monkeypatch.setattr(cluster_watch, "CLUSTER_CHECK_INTERVAL", 0.2)
    checking = asyncio.Event()
    checking.set()
    due = cluster_watch.ClusterWatch.due
    monkeypatch.setattr(cluster_watch.ClusterWatch, "due", lambda watch: checking.is_set() and due(watch))
    topic = kafka.name("t")
    await kafka.create_topics(topic)
    group = kafka.name("g")
    conn = kafka.connection("latest", **{"auto.offset.reset": "latest"})
    trigger = KafkaSharedStreamTrigger([topic], kafka_config_id=conn, group_id=group)
    own_group = watcher_group_id(group, trigger.watcher_digest())
    state_store = InMemoryStateStore()
    async with SharedStreamHarness(confirm_after=0.0, state_store=state_store) as triggerer:
        w = triggerer.add(trigger)
        assert await kafka.wait_committed(own_group, topic, {0: 0}) == {0: 0}
        await kafka.produce(topic, [{"round": 1, "i": i} for i in range(20)])
        await w.wait_for_events(20)
        assert await kafka.wait_committed(own_group, topic, {0: 20}) == {0: 20}
        await _until(lambda: _remembers(state_store), "the stream's memory of its topic ids")
        checking.clear()
        await _admin(kafka, lambda admin: admin.delete_topics([topic]))
        await kafka.create_topics(topic)
        await kafka.produce(topic, [{"round": 2, "i": i} for i in range(25)])
        await _until(
            lambda: {p["value"]["i"] for p in w.payloads if p["value"]["round"] == 2} >= set(range(20, 25)),
            "the new topic's records 20-24, read at the old position",
        )
    first = [p["value"]["i"] for p in w.payloads if p["value"]["round"] == 2]
    # Stopped (its final commits sent): nothing was committed on the new topic past its records 0-19.
    assert (await kafka.committed(own_group, topic)).get(0) in (None, 0), "committed on the new topic"
    checking.set()
    async with SharedStreamHarness(confirm_after=0.0, state_store=state_store) as restarted:
        again = restarted.add(trigger)
        for _ in range(200):  # the restart places the watcher (commits its start) first
            if (await kafka.committed(own_group, topic)).get(0) is not None:
                break
            await asyncio.sleep(0.1)
        await kafka.produce(topic, [{"round": 2, "i": 25}])
        received = await _received_up_to(again, 25)
        assert set(range(20)) <= set(first + received), (
            f"the new topic's first records were skipped: {received}"
        )


@pytest.mark.parametrize("kafka_broker", ["noida-db"], indirect=True)  # a broker without topic ids
async def test_a_topic_created_again_smaller_than_the_position_is_read_from_its_start_without_ids(kafka):
    """
    Class 14, on a broker without topic ids: the stream read 20 records; the topic is deleted and
    created again with 5 records. The stream's next fetch at 20 is out of range and the client
    reset it to the log end (``latest``) before the every-5-s check could see a log ending below
    the position: the check then found nothing, and records 0-4 of the new topic were skipped.
    """
    topic = kafka.name("t")
    await kafka.create_topics(topic)
    group = kafka.name("g")
    conn = kafka.connection("latest", **{"auto.offset.reset": "latest"})
    trigger = KafkaSharedStreamTrigger([topic], kafka_config_id=conn, group_id=group)
    own_group = watcher_group_id(group, trigger.watcher_digest())
    async with SharedStreamHarness(confirm_after=0.0) as triggerer:
        w = triggerer.add(trigger)
        assert await kafka.wait_committed(own_group, topic, {0: 0}) == {0: 0}
        await kafka.produce(topic, [{"round": 1, "i": i} for i in range(20)])
        await w.wait_for_events(20)
        assert await kafka.wait_committed(own_group, topic, {0: 20}) == {0: 20}
        await _admin(kafka, lambda admin: admin.delete_topics([topic]))
        await kafka.create_topics(topic)
        await kafka.produce(topic, [{"round": 2, "i": i} for i in range(5)])
        await asyncio.sleep(1.0)  # the stream fetches at 20 meanwhile (out of range)
        await kafka.produce(topic, [{"round": 2, "i": 5}])

        def second() -> list[int]:
            return [p["value"]["i"] for p in w.payloads if p["value"]["round"] == 2]

        with contextlib.suppress(AssertionError):
            await _until(lambda: set(second()) >= set(range(6)), "the new topic's records", timeout=20)
        assert set(second()) == set(range(6)), f"the new topic's first records were skipped: {second()}"


@pytest.mark.parametrize("kafka_broker", ["tansu"], indirect=True)  # topic ids
async def test_a_topic_created_again_smaller_than_the_position_with_ids(kafka, monkeypatch):
    """
    Class 14, on a broker with topic ids (held): the fetch past the new log's end is reset by
    the stream as ``auto.offset.reset`` says, and the id check then reads the new topic from its
    start, for the watcher too.
    """
    monkeypatch.setattr(cluster_watch, "CLUSTER_CHECK_INTERVAL", 0.2)
    topic = kafka.name("t")
    await kafka.create_topics(topic)
    group = kafka.name("g")
    conn = kafka.connection("latest", **{"auto.offset.reset": "latest"})
    trigger = KafkaSharedStreamTrigger([topic], kafka_config_id=conn, group_id=group)
    own_group = watcher_group_id(group, trigger.watcher_digest())
    async with SharedStreamHarness(confirm_after=0.0) as triggerer:
        w = triggerer.add(trigger)
        assert await kafka.wait_committed(own_group, topic, {0: 0}) == {0: 0}
        await kafka.produce(topic, [{"round": 1, "i": i} for i in range(20)])
        await w.wait_for_events(20)
        assert await kafka.wait_committed(own_group, topic, {0: 20}) == {0: 20}
        await _admin(kafka, lambda admin: admin.delete_topics([topic]))
        await kafka.create_topics(topic)
        await kafka.produce(topic, [{"round": 2, "i": i} for i in range(6)])

        def second() -> list[int]:
            return [p["value"]["i"] for p in w.payloads if p["value"]["round"] == 2]

        with contextlib.suppress(AssertionError):
            await _until(lambda: set(second()) >= set(range(6)), "the new topic's records", timeout=20)
        assert set(second()) == set(range(6)), f"the new topic's first records were skipped: {second()}"


@pytest.mark.parametrize("kafka_broker", ["tansu", "noida-db"], indirect=True)
async def test_a_watcher_paused_across_a_re_creation_resumes_at_the_new_topics_start(
    kafka, monkeypatch, caplog
):
    """
    Class 10 / 14. Two watchers read 20 records; one is paused (its trigger cancelled, its
    position 20 committed). The topic is deleted, as Kafka deletes one (with every group's
    offsets on it: noida-db in its Kafka mode), and created again with 25 records while the other
    runs and reads them all from the new topic's start. The paused watcher resumes with no
    position: it must get the new topic's 25 records, which it never saw, said at WARNING.
    Broke: it joined at the stream's read position and got none of them. A watcher new to the
    stream, added while the paused one is still away from the new log, starts at the read
    position (it was never away), not at the new log's start.
    """
    caplog.set_level(logging.INFO, logger=POSITIONS_LOG)
    monkeypatch.setattr(cluster_watch, "CLUSTER_CHECK_INTERVAL", 0.2)
    last_sent = asyncio.Event()
    stop = OffsetCommitter.stop

    async def stop_and_note(committer: OffsetCommitter, *args: Any, **kwargs: Any) -> None:
        await stop(committer, *args, **kwargs)
        last_sent.set()

    monkeypatch.setattr(OffsetCommitter, "stop", stop_and_note)
    topic = kafka.name("t")
    await kafka.create_topics(topic)
    group = kafka.name("g")

    def watcher(name: str) -> KafkaSharedStreamTrigger:
        return KafkaSharedStreamTrigger(
            [topic], kafka_config_id=kafka.conn_id, group_id=group, match=f"'{name}' != 'never'"
        )

    running, paused = watcher("running"), watcher("paused")
    paused_group = watcher_group_id(group, paused.watcher_digest())
    async with SharedStreamHarness(confirm_after=0.0) as triggerer:
        a = triggerer.add(running)
        b = triggerer.add(paused)
        await kafka.produce(topic, [{"round": 1, "i": i} for i in range(20)])
        await a.wait_for_events(20)
        await b.wait_for_events(20)
        assert await kafka.wait_committed(paused_group, topic, {0: 20}) == {0: 20}
        await triggerer.remove(b)
        # Its last position is sent in the background: sent before the topic goes (one still in
        # flight would land on the new topic, a race no broker can tell from a real commit).
        await asyncio.wait_for(last_sent.wait(), 20)
        running_group = watcher_group_id(group, running.watcher_digest())
        await kafka.delete_topic(topic, groups=(group, running_group, paused_group))
        await kafka.create_topics(topic)
        await kafka.produce(topic, [{"round": 2, "i": i} for i in range(25)])

        def second(w: Any) -> list[int]:
            return [p["value"]["i"] for p in w.payloads if p["value"]["round"] == 2]

        await _until(
            lambda: set(second(a)) >= set(range(25)), "the running watcher's new records", timeout=30
        )
        # A watcher new to the stream, added while the paused one is still away from the new log:
        # it was never away, so it starts at the read position (25), not at the new log's start.
        late = watcher("late")
        late_group = watcher_group_id(group, late.watcher_digest())
        added = triggerer.add(late)

        def late_joined() -> list[str]:
            return [m for r in caplog.records if "joined" in (m := r.getMessage()) and late_group in m]

        await _until(lambda: bool(late_joined()), "the new watcher admitted")
        joined = late_joined()[0]
        assert "at 0@25 (group" in joined, f"a new watcher starts in the new log's past: {joined}"
        assert await kafka.wait_committed(late_group, topic, {0: 25}) == {0: 25}
        resumed = triggerer.add(paused)
        await kafka.produce(topic, [{"round": 2, "i": 25}])
        # It may take the marker before it is admitted (read between fetches): at least once.
        with contextlib.suppress(AssertionError):
            await _until(lambda: set(second(resumed)) >= set(range(26)), "0-25", timeout=30)
        assert set(second(resumed)) >= set(range(26)), f"the paused watcher skipped: {second(resumed)}"
        assert await kafka.wait_committed(paused_group, topic, {0: 26}) == {0: 26}
        await kafka.produce(topic, [{"round": 2, "i": 26}])
        assert await kafka.wait_committed(late_group, topic, {0: 27}) == {0: 27}
        assert set(second(added)) <= {25, 26}, f"a new watcher got the new log's past: {second(added)}"
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("since watcher" in message and "from its start 0" in message for message in warnings), warnings


@pytest.mark.parametrize("kafka_broker", ["noida-db"], indirect=True)  # Tansu: no DeleteRecords
async def test_a_watcher_paused_while_retention_passes_its_position_resumes_at_the_log_start(kafka, caplog):
    """
    Class 11 (held): a watcher is paused at 5 while the stream runs on with another watcher;
    retention deletes 0-14. Resumed into the running stream, it reads 15-29 (seeking the stream
    back for it), says at WARNING that 5-14 are gone, and its position moves on from 15.
    """
    caplog.set_level(logging.INFO, logger=POSITIONS_LOG)
    topic = kafka.name("t")
    await kafka.create_topics(topic)
    group = kafka.name("g")

    def watcher(name: str) -> KafkaSharedStreamTrigger:
        return KafkaSharedStreamTrigger(
            [topic], kafka_config_id=kafka.conn_id, group_id=group, match=f"'{name}' != 'never'"
        )

    running, paused = watcher("running"), watcher("paused")
    paused_group = watcher_group_id(group, paused.watcher_digest())
    async with SharedStreamHarness(confirm_after=0.0) as triggerer:
        a = triggerer.add(running)
        b = triggerer.add(paused)
        await kafka.produce(topic, [{"i": i} for i in range(5)])
        await b.wait_for_events(5)
        assert await kafka.wait_committed(paused_group, topic, {0: 5}) == {0: 5}
        await triggerer.remove(b)
        await kafka.produce(topic, [{"i": i} for i in range(5, 30)])
        await a.wait_for_events(30)
        tp = TopicPartition(topic, 0)
        await _admin(kafka, lambda admin: admin.delete_records({tp: RecordsToDelete(15)}))
        resumed = triggerer.add(paused)
        await kafka.produce(topic, [{"i": 30}])
        # It may take the marker before it is admitted (read between fetches): at least once.
        with contextlib.suppress(AssertionError):
            await _until(lambda: {p["value"]["i"] for p in resumed.payloads} >= set(range(15, 31)), "15-30")
        got = sorted({p["value"]["i"] for p in resumed.payloads})
        assert got == list(range(15, 31)), f"retained records were skipped: {got}"
        assert await kafka.wait_committed(paused_group, topic, {0: 31}) == {0: 31}
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("5-14" in message and "retention" in message for message in warnings), warnings
