"""
Position marks and refreshes (pure logic): what a commit's metadata says, when it is a conflict,
and which offsets a refresh sends again.
"""

from __future__ import annotations

import asyncio
import json

import pytest
from aiokafka import TopicPartition
from aiokafka.errors import OffsetMetadataTooLargeError

from airflow_shared_stream.kafka.committer import OffsetCommitter
from airflow_shared_stream.kafka.errors import KafkaSharedStreamError
from airflow_shared_stream.kafka.marks import LIVE_FOR, PositionMark, disagreements, newest_mark
from airflow_shared_stream.kafka.watcher_positions import WatcherPositions
from airflow_shared_stream.kafka.watchers import StreamWatchers

SHAPE = {"dead_letter_topic": None, "max_in_flight": 500, "max_payload_bytes": 1000}
OTHER = {**SHAPE, "max_payload_bytes": 2000}
NOW = 1_800_000_000.0
TP = TopicPartition("t", 0)


def test_a_mark_survives_the_metadata_round_trip():
    mark = PositionMark(SHAPE, NOW, live=False)
    assert PositionMark.decode(mark.encode()) == mark


@pytest.mark.parametrize(
    "metadata",
    ["", "not json", "[1]", json.dumps({"v": 2, "shape": {}, "at": 1, "live": True}), '{"v": 1}'],
)
def test_metadata_that_is_not_our_mark_is_no_mark(metadata):
    assert PositionMark.decode(metadata) is None


def test_the_newest_mark_of_a_positions_partitions_counts():
    old, new = PositionMark(OTHER, NOW - 10), PositionMark(SHAPE, NOW)
    assert newest_mark([old.encode(), "", new.encode()]) == new
    assert newest_mark(["", "x"]) is None


def test_a_live_writer_of_another_shape_is_a_conflict_naming_the_argument():
    assert disagreements(SHAPE, PositionMark(OTHER, NOW - 1), NOW) == ["max_payload_bytes=2000 (here 1000)"]


@pytest.mark.parametrize(
    "mark",
    [
        None,
        PositionMark(SHAPE, NOW),  # ours, or the same trigger on another triggerer
        PositionMark(OTHER, NOW, live=False),  # it left: a redeploy with other tuning takes over
        PositionMark(OTHER, NOW - LIVE_FOR - 1),  # a triggerer that died long enough ago
    ],
)
def test_no_conflict_without_a_live_writer_of_another_shape(mark):
    assert disagreements(SHAPE, mark, NOW) == []


def _committer(sent: list[dict]) -> OffsetCommitter:
    async def commit(offsets):
        sent.append(dict(offsets))

    return OffsetCommitter(
        commit=commit,
        describe_error=lambda what, exc: KafkaSharedStreamError(what),
    )


async def test_refresh_commits_what_the_broker_took_again_and_never_an_older_target():
    sent: list[dict] = []
    committer = _committer(sent)
    other = TopicPartition("t", 1)
    committer.seed({TP: 3, other: 7})
    committer.queue(TP, 5)
    committer.refresh()
    await committer.flush()
    assert sent == [{TP: 5, other: 7}]
    committer.refresh()
    await committer.flush()
    assert sent[-1] == {TP: 5, other: 7}, "the last offset sent is the one to keep alive"


async def test_a_refused_watcher_sends_nothing_more():
    sent: list[dict] = []
    cursor = StreamWatchers().join("d", "trigger 1")
    cursor.committer = committer = _committer(sent)
    committer.seed({TP: 3})
    committer.queue(TP, 4)
    conflict = RuntimeError("another shape writes this position")
    cursor.refuse(conflict)
    committer.refresh()
    await committer.flush()
    assert sent == []
    assert cursor.committer is None
    with pytest.raises(RuntimeError, match="another shape"):
        cursor.passed(None)  # type: ignore[arg-type]


async def test_a_refresh_while_a_newer_target_is_in_flight_never_sends_an_older_one():
    sent: list[dict] = []
    in_flight, release = asyncio.Event(), asyncio.Event()

    async def commit(offsets):
        sent.append(dict(offsets))
        if len(sent) == 1:
            in_flight.set()
            await release.wait()

    committer = OffsetCommitter(
        commit=commit,
        describe_error=lambda what, exc: KafkaSharedStreamError(what),
    )
    committer.seed({TP: 0})  # the watcher's anchored start
    committer.start()
    committer.queue(TP, 4)
    await asyncio.wait_for(in_flight.wait(), 5)
    committer.refresh()  # the watcher leaves, or a refresh round, while 4 is on its way
    release.set()
    await committer.stop()
    assert [offsets[TP] for offsets in sent] == [4] * len(sent), sent


class MetadataLimitedStore:
    """
    A position store whose cluster refuses commit metadata longer than ``limit`` bytes.

    A stand-in for a limit the real brokers here do not enforce (noida-db kept 5,000 bytes of
    metadata; Tansu keeps none), and a mark stays far below Kafka's default 4,096 (a topic name
    stops at 249 characters).
    """

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.commits: list[tuple[str, dict, str]] = []

    async def commit(self, group, offsets, metadata=""):
        if len(metadata) > self.limit:
            raise OffsetMetadataTooLargeError(f"offsets of group {group!r}")
        self.commits.append((group, dict(offsets), metadata))

    commit_asking_again = commit  # no retriable answers here


async def test_a_cluster_that_refuses_marks_still_gets_every_position():
    positions = WatcherPositions(
        StreamWatchers(),
        topics=["t"],
        shape=SHAPE,
        describe_error=lambda what, exc: KafkaSharedStreamError(what),
    )
    store = MetadataLimitedStore(limit=10)
    positions.bind(store, "g", [TP])  # type: ignore[arg-type]
    cursor = positions.watchers.join("d", "trigger 1")
    await positions._write(cursor, "g.watcher-d", {TP: 3})
    await positions._write(cursor, "g.watcher-d", {TP: 4})
    assert store.commits == [("g.watcher-d", {TP: 3}, ""), ("g.watcher-d", {TP: 4}, "")]
