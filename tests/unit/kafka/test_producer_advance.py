"""The producer's advance: what it commits, seeks and ignores (broker calls recorded by a stub)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from aiokafka import TopicPartition
from aiokafka.errors import CommitFailedError, KafkaConnectionError
from airflow.triggers.shared_stream import AdvanceItem, AdvanceOutcome

from airflow_shared_stream.common.metrics import StreamMetrics
from airflow_shared_stream.kafka import KafkaSharedStreamError, KafkaSharedStreamProducer
from airflow_shared_stream.kafka.committer import OffsetCommitter
from airflow_shared_stream.kafka.envelope import KafkaBrokerPayload
from airflow_shared_stream.kafka.settler import FOLD_ACKS_AT
from airflow_shared_stream.kafka.watchers import Receipt
from tests.support.waiting import eventually

TP = TopicPartition("t", 0)
LANE = ("t", 0)
ACK, FAIL, REJECT, NOBODY = (
    AdvanceOutcome(1, 0, 0),
    AdvanceOutcome(1, 1, 0),
    AdvanceOutcome(1, 0, 1),
    AdvanceOutcome(0, 0, 0),
)


class RecordingConsumer:
    def __init__(self, fail_with: Exception | None = None) -> None:
        self.commits: list[dict[TopicPartition, int]] = []
        self.seeks: list[tuple[TopicPartition, int]] = []
        self.fail_with = fail_with
        self.assigned = {TP}

    async def commit(self, offsets: dict[TopicPartition, int]) -> None:
        if self.fail_with is not None:
            raise self.fail_with
        self.commits.append(dict(offsets))

    def seek(self, tp: TopicPartition, offset: int) -> None:
        self.seeks.append((tp, offset))

    def assignment(self) -> set[TopicPartition]:
        return set(self.assigned)


def producer_with(consumer: RecordingConsumer, *, dlq=None, **kwargs) -> KafkaSharedStreamProducer:
    kwargs.setdefault("max_in_flight", 10)
    producer = KafkaSharedStreamProducer(topics=["t"], group_id="g", **kwargs)
    producer.attach(consumer, dlq)  # type: ignore[arg-type]
    return producer


def batch(*items: tuple[int, AdvanceOutcome]) -> list[AdvanceItem]:
    return [AdvanceItem(KafkaBrokerPayload("t", 0, offset), outcome) for offset, outcome in items]


async def test_acks_are_committed_cumulatively_in_one_request():
    consumer = RecordingConsumer()
    producer = producer_with(consumer)
    for _ in range(3):
        producer.credits.take()
    await producer.advance(batch((0, ACK), (1, ACK)))
    await producer.advance(batch((2, REJECT)))  # no dead-letter topic: dropped with a warning
    assert producer.credits.in_flight == 0
    await producer.committer.flush()
    assert consumer.commits == [{TP: 3}]
    assert consumer.seeks == []


async def test_failure_holds_the_floor_and_seeks_back():
    consumer = RecordingConsumer()
    producer = producer_with(consumer)
    await producer.advance(batch((0, ACK), (1, FAIL), (2, ACK)))
    await producer.committer.flush()
    assert consumer.commits == [{TP: 1}]
    assert consumer.seeks == [(TP, 1)]
    assert producer.fetch_epochs.get(TP, 0) == 1  # records fetched before the seek are now stale


async def test_nobody_subscribed_redelivers_after_a_pause_that_ends_once_someone_is():
    consumer = RecordingConsumer()
    producer = producer_with(consumer)
    await producer.advance(batch((0, NOBODY)))
    assert consumer.seeks == [(TP, 0)]
    assert producer.backoff.delay > 0
    await producer.advance(batch((0, ACK)))
    assert producer.backoff.delay == 0


async def test_commit_lost_to_a_rebalance_does_not_fail_the_stream():
    producer = producer_with(RecordingConsumer(fail_with=CommitFailedError("rebalanced")))
    await producer.advance(batch((0, ACK)))
    await producer.committer.flush()
    assert producer.committer.error is None


async def test_other_commit_failures_fail_the_next_advance():
    producer = producer_with(RecordingConsumer(fail_with=KafkaConnectionError("broker gone")))
    await producer.advance(batch((0, ACK)))
    await producer.committer.flush()
    with pytest.raises(KafkaSharedStreamError, match="committing offsets failed"):
        await producer.advance(batch((1, ACK)))


class RecordingMetrics(StreamMetrics):
    """The producer's metrics, kept instead of sent (the reporting logic is StreamMetrics' own)."""

    def __init__(self) -> None:
        super().__init__("kafka", "t")
        self.counts: dict[str, int] = {}
        self.gauges: dict[str, float] = {}
        self.timings: list[str] = []

    def incr(self, metric: str, count: int = 1) -> None:
        self.counts[metric] = self.counts.get(metric, 0) + count

    def gauge(self, metric: str, value: float) -> None:
        self.gauges[metric] = value

    def timing_ms(self, metric: str, milliseconds: float) -> None:
        self.timings.append(metric)


async def test_advance_reports_settlements_fan_out_and_latency():
    producer = producer_with(RecordingConsumer())
    metrics = RecordingMetrics()
    producer.metrics = producer.settler.metrics = metrics  # type: ignore[assignment]
    for _ in range(4):
        producer.credits.take()
    await producer.advance(batch((0, ACK), (1, REJECT), (2, FAIL), (3, NOBODY)))
    assert metrics.counts == {
        "fanned_out": 1 + 2 + 2,
        "acked": 1,
        "dead_lettered": 1,
        "redelivered": 2,
        "no_subscriber": 1,
        "watcher_failures": 1,  # the FAIL item: one watcher did not finish it
    }
    assert metrics.gauges["in_flight"] == 0
    assert metrics.timings == ["advance_latency"]


async def test_ack_only_advances_are_folded_at_the_committers_round_in_one_request():
    """One message per advance at one watcher: each is kept, and one round folds them all."""
    consumer = RecordingConsumer()
    producer = producer_with(consumer)
    for offset in range(3):
        producer.credits.take()
        await producer.advance(batch((offset, ACK)))
    assert producer.credits.in_flight == 0  # credits come back at once
    assert producer.ledger.committed(LANE) is None  # not folded yet
    producer.committer.start()  # its round folds them and sends one commit
    await eventually(lambda: consumer.commits, bool, timeout=5, what="the committer's round")
    await producer.committer.stop()
    assert producer.ledger.committed(LANE) == 3
    assert consumer.commits == [{TP: 3}]


async def test_ack_only_advances_are_folded_once_fold_acks_at_wait_without_a_round():
    """Kept advance items are freed early rather than kept for a whole round (FOLD_ACKS_AT)."""
    consumer = RecordingConsumer()
    producer = producer_with(consumer, max_in_flight=FOLD_ACKS_AT)
    for offset in range(FOLD_ACKS_AT - 1):
        producer.credits.take()
        await producer.advance(batch((offset, ACK)))
    assert producer.ledger.committed(LANE) is None  # below the threshold: kept for the round
    producer.credits.take()
    await producer.advance(batch((FOLD_ACKS_AT - 1, ACK)))
    assert producer.ledger.committed(LANE) == FOLD_ACKS_AT  # folded in the advance that reached it
    assert producer.committer.pending == {TP: FOLD_ACKS_AT}  # the commit still waits for the round
    assert consumer.commits == []


async def test_a_batch_that_is_not_all_acks_folds_the_earlier_acks_of_its_lane_first():
    consumer = RecordingConsumer()
    producer = producer_with(consumer)
    await producer.advance(batch((0, ACK)))
    await producer.advance(batch((1, ACK)))
    await producer.advance(batch((2, FAIL), (3, ACK)))
    assert consumer.seeks == [(TP, 2)]
    await producer.committer.flush()
    assert consumer.commits == [{TP: 2}]  # past the ACKs, held at the redelivered offset


async def test_a_leaving_watchers_last_position_covers_the_acks_kept_for_the_round():
    producer = producer_with(RecordingConsumer())
    sent: list[dict[TopicPartition, int]] = []

    async def commit(offsets: dict[TopicPartition, int]) -> None:
        sent.append(dict(offsets))

    receipt = Receipt(_no_records())
    cursor = producer.watchers.join("digest", "trigger 1", receipt)
    producer.watchers.take_pending()
    cursor.since_seq, cursor.next[TP] = 0, 0
    cursor.committer = OffsetCommitter(commit=commit, describe_error=producer._error)
    cursor.committer.start()
    receipt.took(0)
    receipt.finished = 0  # the filter came back for the next record: it finished seq 0
    await producer.advance([AdvanceItem(KafkaBrokerPayload("t", 0, 0, 0), ACK)])
    producer.watchers.leave(cursor, receipt)  # before the stream committer's round folded the ACK
    await producer.watchers.closed()
    assert sent == [{TP: 1}]


async def _no_records() -> AsyncIterator[object]:
    return
    yield  # pragma: no cover - makes this an async generator
