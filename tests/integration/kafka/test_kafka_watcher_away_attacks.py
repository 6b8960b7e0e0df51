"""
Attacks on "a watcher paused across a topic's re-creation reads the new log from its start"
(``WatcherPositions.new_logs``), FAULT_MODEL classes 3, 10, 11, 14, on real brokers.

Each :class:`SharedStreamHarness` is one triggerer; a watcher is paused by removing its trigger
(Airflow cancels it) and resumed by adding it again. Topics are deleted as Apache Kafka deletes
them: with every group's offsets on them (``KafkaSandbox.delete_topic``). On noida-db (no topic
ids) empty fetches are held as Kafka holds them (``tests/support/kafka_fetch_wait.py``), and a
re-created topic is written to only once the stream follows its new log (``_Rig.recreate``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

import pytest
from aiokafka.admin import NewPartitions

from airflow_shared_stream.kafka import cluster_watch
from airflow_shared_stream.kafka.committer import OffsetCommitter
from airflow_shared_stream.kafka.trigger import KafkaSharedStreamTrigger
from airflow_shared_stream.kafka.watchers import watcher_group_id
from airflow_shared_stream.testing import SharedStreamHarness
from tests.integration.kafka.test_kafka_cluster_changes import _admin, _until
from tests.support.kafka_fetch_wait import hold_empty_fetches

pytestmark = [pytest.mark.integration, pytest.mark.timeout(150)]

POSITIONS_LOG = "airflow_shared_stream.kafka"


@pytest.fixture(autouse=True)
def kafka_fetch_timing(kafka_broker: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """On noida-db, empty fetches are held as Kafka holds them (these tests must not rest on it)."""
    if kafka_broker.name == "noida-db":
        hold_empty_fetches(monkeypatch)


class _Rig:
    """Two watchers of one stream (``running`` and ``paused``) and the event of a last position sent."""

    def __init__(self, kafka: Any, monkeypatch: pytest.MonkeyPatch) -> None:
        monkeypatch.setattr(cluster_watch, "CLUSTER_CHECK_INTERVAL", 0.2)
        self.kafka = kafka
        self.last_sent = asyncio.Event()
        stop = OffsetCommitter.stop
        rig = self

        async def stop_and_note(committer: OffsetCommitter, *args: Any, **kwargs: Any) -> None:
            await stop(committer, *args, **kwargs)
            rig.last_sent.set()

        monkeypatch.setattr(OffsetCommitter, "stop", stop_and_note)
        self.topic = kafka.name("t")
        self.group = kafka.name("g")
        self.running, self.paused = self.watcher("running"), self.watcher("paused")
        self.running_group = watcher_group_id(self.group, self.running.watcher_digest())
        self.paused_group = watcher_group_id(self.group, self.paused.watcher_digest())
        self.new_logs = _NewLogsSeen(self.topic)
        checks = logging.getLogger(cluster_watch.__name__)
        monkeypatch.setattr(checks, "handlers", [*checks.handlers, self.new_logs])

    def watcher(self, name: str) -> KafkaSharedStreamTrigger:
        return KafkaSharedStreamTrigger(
            [self.topic],
            kafka_config_id=self.kafka.conn_id,
            group_id=self.group,
            match=f"'{name}' != 'never'",
        )

    async def pause(self, triggerer: SharedStreamHarness, handle: Any) -> None:
        """Cancel ``handle``'s trigger and wait until its last position was sent."""
        self.last_sent.clear()
        await triggerer.remove(handle)
        await asyncio.wait_for(self.last_sent.wait(), 20)

    async def recreate(self, records: list[dict[str, Any]]) -> None:
        """
        Delete the topic, create it again and produce ``records``. Without topic ids (noida-db),
        produce only once the stream saw the new log: produced up to the old position or past it
        before the stream's next fetch, the new log is not seen there (docs/kafka.rst, "Not
        seen"), and only noida-db's instant empty fetches made the stream see it first.
        """
        groups = (self.group, self.running_group, self.paused_group)
        seen = self.new_logs.times
        await self.kafka.delete_topic(self.topic, groups=groups)
        await self.kafka.create_topics(self.topic)
        if self.kafka.broker.name == "noida-db":
            await _until(lambda: self.new_logs.times > seen, "the stream to follow the new log")
        await self.kafka.produce(self.topic, records)


class _NewLogsSeen(logging.Handler):
    """Counts the stream's WARNINGs that ``topic``'s partition 0 is a new log (it follows it)."""

    def __init__(self, topic: str) -> None:
        super().__init__(logging.WARNING)
        self.said = f"Kafka {topic}/0 is a new log"
        self.times = 0

    def emit(self, record: logging.LogRecord) -> None:
        if record.getMessage().startswith(self.said):
            self.times += 1


def _round(handle: Any, n: int, partition: int | None = None) -> list[int]:
    return [
        p["value"]["i"]
        for p in handle.payloads
        if p["value"].get("round") == n and (partition is None or p["value"].get("p") == partition)
    ]


@pytest.mark.parametrize("kafka_broker", ["tansu", "noida-db"], indirect=True)
async def test_a_watcher_paused_across_two_re_creations_reads_the_last_new_log_from_its_start(
    kafka, monkeypatch, caplog
):
    """
    Class 14 (held): the paused watcher stays away while its topic is deleted and created again
    twice, the running watcher reading each new log. Resumed, it reads the last log from its
    start (the second log is gone with its topic: nobody can read it).
    Was intermittent on a loaded machine (reproduced with four busy loops, on noida-db): the
    running watcher's ACKs of log 2 (offsets 0-14), still kept for the committer's next round,
    were folded after log 3 started, moved its position from 0 to 15 on log 3, and its filter
    skipped log 3's records as passed; or a watcher's position commit landed while the topic was
    gone, Kafka refused it (UNKNOWN_TOPIC_OR_PARTITION), that failed the stream, and the
    restarted stream no longer knew the paused watcher was away (it skipped log 3's 0-3).
    test_kafka_re_creation_races.py makes each happen every time, on that code.
    """
    caplog.set_level(logging.INFO, logger=POSITIONS_LOG)
    rig = _Rig(kafka, monkeypatch)
    await kafka.create_topics(rig.topic)
    async with SharedStreamHarness(confirm_after=0.0) as triggerer:
        a = triggerer.add(rig.running)
        b = triggerer.add(rig.paused)
        await kafka.produce(rig.topic, [{"round": 1, "i": i} for i in range(10)])
        await a.wait_for_events(10)
        await b.wait_for_events(10)
        assert await kafka.wait_committed(rig.paused_group, rig.topic, {0: 10}) == {0: 10}
        await rig.pause(triggerer, b)
        await rig.recreate([{"round": 2, "i": i} for i in range(15)])
        await _until(lambda: set(_round(a, 2)) >= set(range(15)), "log 2 read by the running one")
        await rig.recreate([{"round": 3, "i": i} for i in range(4)])
        await _until(lambda: set(_round(a, 3)) >= set(range(4)), "log 3 read by the running one")
        resumed = triggerer.add(rig.paused)
        await kafka.produce(rig.topic, [{"round": 3, "i": 4}])
        with contextlib.suppress(AssertionError):
            await _until(lambda: set(_round(resumed, 3)) >= set(range(5)), "0-4 of log 3")
        assert set(_round(resumed, 3)) >= set(range(5)), f"skipped: {_round(resumed, 3)}"
        assert await kafka.wait_committed(rig.paused_group, rig.topic, {0: 5}) == {0: 5}
        # The running one may fire again for records in flight when the stream seeks back for the
        # returning one (docs: duplicates, never loss); it loses none.
        await _until(lambda: 4 in _round(a, 3), "the marker at the running one")
        assert set(_round(a, 3)) == set(range(5)), _round(a, 3)


@pytest.mark.parametrize("kafka_broker", ["noida-db"], indirect=True)  # Tansu: no CreatePartitions
async def test_a_watcher_paused_while_a_partition_is_added_reads_it_from_its_start(
    kafka, monkeypatch, caplog
):
    """
    Class 14 (the code and docs/kafka.rst claim it; no test showed it): while one watcher is
    paused a partition is added and records produced to it; the running watcher reads them. The
    paused one resumes with a position on partition 0 only: it must read partition 1 from its
    start (not be anchored at the stream's read position there), and partition 0 from its own.
    """
    caplog.set_level(logging.INFO, logger=POSITIONS_LOG)
    rig = _Rig(kafka, monkeypatch)
    await kafka.create_topics(rig.topic)
    async with SharedStreamHarness(confirm_after=0.0) as triggerer:
        a = triggerer.add(rig.running)
        b = triggerer.add(rig.paused)
        await kafka.produce(rig.topic, [{"round": 1, "p": 0, "i": i} for i in range(5)], partition=0)
        await a.wait_for_events(5)
        await b.wait_for_events(5)
        assert await kafka.wait_committed(rig.paused_group, rig.topic, {0: 5}) == {0: 5}
        await rig.pause(triggerer, b)
        await _admin(kafka, lambda admin: admin.create_partitions({rig.topic: NewPartitions(2)}))
        await kafka.produce(rig.topic, [{"round": 2, "p": 1, "i": i} for i in range(6)], partition=1)
        await kafka.produce(rig.topic, [{"round": 2, "p": 0, "i": i} for i in range(3)], partition=0)
        await _until(lambda: len(_round(a, 2)) >= 9, "the running watcher's new records")
        resumed = triggerer.add(rig.paused)
        await kafka.produce(rig.topic, [{"round": 2, "p": 1, "i": 6}], partition=1)
        with contextlib.suppress(AssertionError):
            await _until(lambda: set(_round(resumed, 2, 1)) >= set(range(7)), "partition 1 0-6")
        assert set(_round(resumed, 2, 1)) >= set(range(7)), f"partition 1 skipped: {_round(resumed, 2, 1)}"
        assert set(_round(resumed, 2, 0)) >= set(range(3)), f"partition 0 skipped: {_round(resumed, 2, 0)}"
        expected = {0: 8, 1: 7}
        assert await kafka.wait_committed(rig.paused_group, rig.topic, expected, partitions=2) == expected
        await _until(lambda: 6 in _round(a, 2, 1), "the marker at the running one")
        assert set(_round(a, 2, 1)) == set(range(7)), _round(a, 2, 1)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("since watcher" in m and "/1 " in m for m in warnings), warnings


@pytest.mark.parametrize("kafka_broker", ["noida-db"], indirect=True)  # Tansu: no commit to a deleted group
async def test_a_watcher_that_came_back_after_a_re_creation_is_no_longer_away(kafka, monkeypatch, caplog):
    """
    Class 11 / 14. The paused watcher comes back after its topic's re-creation and reads the new
    log from its start (right). It is paused again and stays away longer than the broker's
    ``offsets.retention.minutes``: its position expires, as docs/kafka.rst ("Idle streams") says a
    watcher's that runs nowhere does (played by deleting its group, as the idle-stream test does).
    Resumed, it must not read again the records it already fired for: it was not away when the
    topic was created again this time; it was served on the new log since.
    Broke: the stream still counted it among the watchers away at the re-creation, so it read the
    new log again from offset 0 and fired again for every record (0-15 of round 2). Now it starts
    at the read position, as any watcher whose position expired (docs/kafka.rst, "Idle streams").
    """
    caplog.set_level(logging.INFO, logger=POSITIONS_LOG)
    rig = _Rig(kafka, monkeypatch)
    await kafka.create_topics(rig.topic)
    async with SharedStreamHarness(confirm_after=0.0) as triggerer:
        a = triggerer.add(rig.running)
        b = triggerer.add(rig.paused)
        await kafka.produce(rig.topic, [{"round": 1, "i": i} for i in range(5)])
        await a.wait_for_events(5)
        await b.wait_for_events(5)
        assert await kafka.wait_committed(rig.paused_group, rig.topic, {0: 5}) == {0: 5}
        await rig.pause(triggerer, b)
        await rig.recreate([{"round": 2, "i": i} for i in range(15)])
        await _until(lambda: set(_round(a, 2)) >= set(range(15)), "the running watcher's new records")
        back = triggerer.add(rig.paused)
        await kafka.produce(rig.topic, [{"round": 2, "i": 15}])
        await _until(lambda: set(_round(back, 2)) >= set(range(16)), "the new log from its start")
        assert await kafka.wait_committed(rig.paused_group, rig.topic, {0: 16}) == {0: 16}
        await rig.pause(triggerer, back)
        await kafka.delete_groups(rig.paused_group)  # its position expired while it ran nowhere
        again = triggerer.add(rig.paused)
        await kafka.produce(rig.topic, [{"round": 3, "i": 0}])
        assert await kafka.wait_committed(rig.paused_group, rig.topic, {0: 17}) == {0: 17}
        await _until(lambda: set(_round(a, 3)) == {0}, "the running watcher's round 3")
        assert _round(again, 2) == [], f"fired again for records it had fired for: {_round(again, 2)}"


@pytest.mark.parametrize("kafka_broker", ["tansu", "noida-db"], indirect=True)
async def test_a_watcher_paused_while_its_topic_is_gone_for_a_while_reads_the_new_log_from_its_start(
    kafka, monkeypatch, caplog
):
    """
    Class 14 / 3: the topic stays deleted for several cluster checks (an operator re-creating it
    by hand) before it is created again, while one watcher runs and one is paused. The stream
    must live through the gap (a stream that restarts forgets whom it served, and the paused
    watcher would then skip the new log): the paused one resumes and reads the new log whole.
    """
    caplog.set_level(logging.INFO, logger=POSITIONS_LOG)
    rig = _Rig(kafka, monkeypatch)
    await kafka.create_topics(rig.topic)
    async with SharedStreamHarness(confirm_after=0.0) as triggerer:
        a = triggerer.add(rig.running)
        b = triggerer.add(rig.paused)
        await kafka.produce(rig.topic, [{"round": 1, "i": i} for i in range(10)])
        await a.wait_for_events(10)
        await b.wait_for_events(10)
        assert await kafka.wait_committed(rig.paused_group, rig.topic, {0: 10}) == {0: 10}
        await rig.pause(triggerer, b)
        groups = (rig.group, rig.running_group, rig.paused_group)
        await kafka.delete_topic(rig.topic, groups=groups)
        await asyncio.sleep(3)  # gone for about fifteen checks
        await kafka.create_topics(rig.topic)
        await kafka.produce(rig.topic, [{"round": 2, "i": i} for i in range(6)])
        await _until(lambda: set(_round(a, 2)) >= set(range(6)), "the running watcher's new log")
        resumed = triggerer.add(rig.paused)
        await kafka.produce(rig.topic, [{"round": 2, "i": 6}])
        with contextlib.suppress(AssertionError):
            await _until(lambda: set(_round(resumed, 2)) >= set(range(7)), "0-6 of the new log")
        assert set(_round(resumed, 2)) >= set(range(7)), f"skipped: {_round(resumed, 2)}"


@pytest.mark.parametrize("kafka_broker", ["tansu", "noida-db"], indirect=True)
async def test_a_watcher_back_from_one_re_creation_and_away_across_the_next_reads_the_next_from_its_start(
    kafka, monkeypatch
):
    """
    Class 14: away across a re-creation, back (it reads the new log, and is no longer away from
    it), then paused again across a second re-creation: it is away from that one, and resumed it
    reads the third log from its start.
    """
    rig = _Rig(kafka, monkeypatch)
    await kafka.create_topics(rig.topic)
    async with SharedStreamHarness(confirm_after=0.0) as triggerer:
        a = triggerer.add(rig.running)
        b = triggerer.add(rig.paused)
        await kafka.produce(rig.topic, [{"round": 1, "i": i} for i in range(8)])
        await a.wait_for_events(8)
        await b.wait_for_events(8)
        assert await kafka.wait_committed(rig.paused_group, rig.topic, {0: 8}) == {0: 8}
        await rig.pause(triggerer, b)
        await rig.recreate([{"round": 2, "i": i} for i in range(12)])
        await _until(lambda: set(_round(a, 2)) >= set(range(12)), "log 2 read by the running one")
        back = triggerer.add(rig.paused)
        await kafka.produce(rig.topic, [{"round": 2, "i": 12}])
        await _until(lambda: set(_round(back, 2)) >= set(range(13)), "log 2 from its start")
        assert await kafka.wait_committed(rig.paused_group, rig.topic, {0: 13}) == {0: 13}
        await rig.pause(triggerer, back)
        await rig.recreate([{"round": 3, "i": i} for i in range(3)])
        await _until(lambda: set(_round(a, 3)) >= set(range(3)), "log 3 read by the running one")
        again = triggerer.add(rig.paused)
        await kafka.produce(rig.topic, [{"round": 3, "i": 3}])
        with contextlib.suppress(AssertionError):
            await _until(lambda: set(_round(again, 3)) >= set(range(4)), "0-3 of log 3")
        assert set(_round(again, 3)) >= set(range(4)), f"skipped: {_round(again, 3)}"


@pytest.mark.parametrize("kafka_broker", ["tansu", "noida-db"], indirect=True)
async def test_a_returning_watchers_start_on_the_new_log_is_committed_before_its_first_record(
    kafka, monkeypatch
):
    """
    Class 3 / 14: the paused watcher resumes after its topic's re-creation while nothing is
    persisted (the metadata database is down), so none of its records settle. Its start on the
    new log (0) must be committed at once: a triggerer killed now (no last position sent) has
    it resume there on any triggerer, not at a new stream's read position, skipping the new log.
    """
    rig = _Rig(kafka, monkeypatch)
    await kafka.create_topics(rig.topic)
    async with SharedStreamHarness(confirm_after=0.0) as triggerer:
        a = triggerer.add(rig.running)
        b = triggerer.add(rig.paused)
        await kafka.produce(rig.topic, [{"round": 1, "i": i} for i in range(6)])
        await a.wait_for_events(6)
        await b.wait_for_events(6)
        assert await kafka.wait_committed(rig.paused_group, rig.topic, {0: 6}) == {0: 6}
        await rig.pause(triggerer, b)
        await rig.recreate([{"round": 2, "i": i} for i in range(9)])
        await _until(lambda: set(_round(a, 2)) >= set(range(9)), "the running watcher's new log")
        assert await kafka.wait_committed(rig.running_group, rig.topic, {0: 9}) == {0: 9}
        triggerer.persisting = False
        resumed = triggerer.add(rig.paused)
        await kafka.produce(rig.topic, [{"round": 2, "i": 9}])
        await _until(lambda: 9 in _round(resumed, 2), "the resumed watcher's records")
        assert await kafka.wait_committed(rig.paused_group, rig.topic, {0: 0}) == {0: 0}
