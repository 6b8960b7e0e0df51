"""
Redrive from a Kafka dead-letter topic to the original topic (the protocol of common/redrive.py).

A dead-letter topic is a log: nothing is deleted from it. The redrive's consumer group
(``group_id``, by default ``shared-stream-redrive.<dead-letter topic>``) remembers how far the
redrives got. Each record is produced to its original topic (``source``, or the
``x-shared-stream-topic`` header our dead-lettering wrote) with its key (so the topic's
partitioner puts it where records of that key go) and its headers, ``acks=all``; the group's
offset on the dead-letter topic is committed only past records whose copy the brokers
acknowledged, or that the ``filter`` passed over. A refused copy stops its partition for this
redrive: the records after it are not copied (a broker's late refusal may leave some already
sent: duplicates) and nothing from it on is committed, so the next redrive reads it again.

Where a record goes (the origin rule, docs/redrive.rst): to the topic its
``x-shared-stream-topic`` header names, which our dead-lettering always writes. With ``source``
given, a record whose header names another topic is left untouched (a dead-letter topic shared
by streams), and the redrive's default group is that source's own
(``shared-stream-redrive.<dead-letter topic>.<source>``), so what it passes stays there for the
other stream's redrive. A record with no such header (not ours: its origin is unknown) is left
too. A pointer record (what our dead-lettering writes for a record too large to copy) is not the
original and is never produced as one: it is refused, named in the log with where the original
is, and nothing in its partition is committed past it.

The consumer is a member of the group (``kafka/redrive_membership.py``): the coordinator gives
each partition to one redrive at a time and fences commits by generation, so two redrives of one
dead-letter topic at once move each record once. Its snapshot is each partition's end offset when
the redrive started, before its first copy: the high watermark (the last stable offset under
``read_committed``) a fetch answers with. It never reads at or past it, so copies that come back
to the dead-letter topic while it runs (a watcher rejected them again) wait for the next redrive.
Offsets only: no clock is compared, so neither the worker's nor the dead-letterer's clock moves
the bound.

Records the ``filter`` leaves are appended again to the end of their partition of the
dead-letter topic (acknowledged) before the group commits past them: they stay in the topic,
reachable by the next redrive and counted in its depth, while the group still moves on past the
records it moved. A redrive killed between the two leaves a skipped record twice (a duplicate).
A redrive holds nothing between reads: its memory is one batch whatever the topic's depth.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.errors import IllegalStateError, KafkaError

from airflow_shared_stream.common.redrive import RedriveItem, RedriveRoute, RedriveSnapshot
from airflow_shared_stream.common.trigger import DEFAULT_MAX_PAYLOAD_BYTES
from airflow_shared_stream.kafka.dead_letter import (
    ORIGIN_HEADERS,
    REASON_HEADER,
    SIZE_HEADER,
    start_dead_letter_producer,
)
from airflow_shared_stream.kafka.errors import (
    KafkaConfigurationError,
    KafkaSharedStreamError,
    KafkaTopicNotFoundError,
)
from airflow_shared_stream.kafka.hook import KafkaSharedStreamHook
from airflow_shared_stream.kafka.log_bounds import fetched_log_ends
from airflow_shared_stream.kafka.producer import build_raw_message
from airflow_shared_stream.kafka.redrive_membership import RedriveMembership

log = logging.getLogger(__name__)

OUR_HEADERS = frozenset((*ORIGIN_HEADERS, REASON_HEADER, SIZE_HEADER))
"""The headers our dead-lettering adds (stripped unless ``keep_origin_attributes``)."""
ORIGIN_TOPIC_HEADER = ORIGIN_HEADERS[0]
READ_TIMEOUT_MS = 1000


def source_topics(source: str | None) -> frozenset[str] | None:
    """
    The topics a ``source`` names: one, or several separated by commas (a Kafka topic name has no
    comma), as the Streams page names a stream that reads several; ``None``: not given.
    """
    if not source:
        return None
    topics = frozenset(t.strip() for t in str(source).split(",") if t.strip())
    return topics or None


def stream_source(topics: Any) -> str:
    """How the Streams page names a stream's topics as ``source`` (sorted, comma-separated)."""
    names = [topics] if isinstance(topics, str) else list(topics or ())
    return ",".join(sorted({str(t).strip() for t in names if str(t).strip()}))


def default_group_id(dead_letter_topic: str, source: str | None = None) -> str:
    """The redrive's group: one per destination when ``source`` is given (others' records stay)."""
    base = f"shared-stream-redrive.{dead_letter_topic}"
    topics = source_topics(source)
    return base if topics is None else f"{base}.{','.join(sorted(topics))}"


class KafkaDeadLetterSource:
    """
    Read a dead-letter topic from the redrive group's committed offsets; produce; commit.

    :param dead_letter: the dead-letter topic.
    :param source: the topic to produce to; ``None`` takes each record's origin header.
    """

    broker = "kafka"
    lease_seconds = None  # a log: a record not committed past is read again, nothing is held

    def __init__(
        self,
        *,
        dead_letter: str,
        source: str | None = None,
        conn_id: str | None = None,
        keep_origin_attributes: bool = False,
        group_id: str | None = None,
    ) -> None:
        if not dead_letter or not isinstance(dead_letter, str):
            raise KafkaConfigurationError("a Kafka redrive needs the dead-letter topic (dead_letter=...)")
        self._topic = dead_letter
        self._targets = source_topics(source)
        """The topics this redrive may write to (``None``: each record's own, from its header)."""
        self._target = None if self._targets is None else ",".join(sorted(self._targets))
        if self._targets is not None and len(self._targets) > 1 and dead_letter in self._targets:
            raise KafkaConfigurationError(
                f"the dead-letter source and the destination of the kafka redrive of {dead_letter!r} "
                "are one topic: every message moved would come straight back"
            )
        self._conn_id = conn_id or KafkaSharedStreamHook.default_conn_name
        self._keep = keep_origin_attributes
        self._group_id = group_id or default_group_id(dead_letter, source)
        self._consumer: AIOKafkaConsumer | None = None
        self._producer: AIOKafkaProducer | None = None
        self._scrubber: Any = None
        self._ends: dict[TopicPartition, int] = {}
        """The snapshot: each partition's end offset when the redrive started (exclusive)."""
        self._stopped: set[TopicPartition] = set()
        self._done: set[TopicPartition] = set()
        """Partitions read up to the snapshot."""
        self._unsettled: dict[TopicPartition, list[int]] = {}
        """Offsets read and not yet moved or passed, per partition, in order."""
        self._handled: dict[TopicPartition, set[int]] = {}
        self._membership: RedriveMembership | None = None
        self.reached_all = True
        """``False`` once this redrive ended with records of its snapshot in partitions the group
        gave another member: its ``left`` is then unknown (common/redrive.py), never 0."""
        self.label = dead_letter

    @property
    def route(self) -> RedriveRoute:
        """``write_to`` is ``None`` without ``source``: each record goes to the topic its header names."""
        return RedriveRoute("topic", read_from=self._topic, write_to=self._target)

    async def open(self) -> None:
        config = await KafkaSharedStreamHook(self._conn_id).aget_client_config()
        self._scrubber = config.scrubber()
        kwargs = config.consumer_kwargs(self._group_id)
        kwargs["auto_offset_reset"] = "earliest"  # a group that never redrove starts at the beginning
        self._consumer = consumer = AIOKafkaConsumer(**kwargs)
        try:
            await consumer.start()
            # Sized to the dead-letter topic's max.message.bytes, as the dead-lettering's producer is:
            # the skipped records appended again would otherwise go in batches the topic refuses.
            self._producer = await start_dead_letter_producer(config.producer_kwargs(), self._topic)
            topics = await consumer.topics()
        except KafkaError as exc:
            raise self._error("cannot connect", exc) from None
        for topic in (self._topic, *sorted(self._targets or ())):
            if topic not in topics:
                raise KafkaTopicNotFoundError(
                    f"Kafka topic {topic!r} does not exist (connection {self._conn_id!r})"
                )
        partitions = [
            TopicPartition(self._topic, p) for p in sorted(consumer.partitions_for_topic(self._topic) or ())
        ]
        try:
            self._ends = await fetched_log_ends(kwargs, partitions)
        except KafkaError as exc:
            raise self._error(f"cannot read the end offsets of {self._topic!r}", exc) from None
        # A member of its group (redrive_membership.py): two redrives at once never read one partition.
        self._membership = RedriveMembership(consumer, self._group_id)
        consumer.subscribe([self._topic], listener=self._membership)
        try:
            await self._membership.wait_assigned()
        except TimeoutError as exc:
            raise self._error("joining the redrive group failed", exc) from None

    async def close(self) -> None:
        if self._membership is not None:
            self._membership.end_batch()  # a rebalance never waits on a redrive that is over
        for client in (self._producer, self._consumer):
            if client is not None:
                try:
                    await client.stop()
                except Exception as exc:  # best effort: the redrive is over
                    log.debug("Stopping a Kafka client failed: %s", type(exc).__name__)

    async def snapshot(self) -> RedriveSnapshot:
        """
        The end offsets taken when opened (before any copy): a record at or past its partition's
        end offset is the next redrive's. No count (``depth`` is ``None``): it reads to those ends.
        """
        ends = {tp.partition: end for tp, end in sorted(self._ends.items())}
        return RedriveSnapshot(depth=None, bound=f"end offsets {ends} of {self._topic!r}")

    async def read(self, limit: int) -> Sequence[RedriveItem]:
        consumer, membership = self._consumer, self._membership
        assert consumer is not None
        assert membership is not None
        while True:
            await membership.wait_assigned()
            epoch = membership.epoch
            reading = [
                tp
                for tp in sorted(consumer.assignment())
                if tp in self._ends and tp not in self._stopped and tp not in self._done
            ]
            if not reading:  # what the group gave this redrive is read up to the snapshot
                await self._note_unreached()
                return []
            try:
                batches = await consumer.getmany(*reading, timeout_ms=READ_TIMEOUT_MS, max_records=limit)
            except IllegalStateError:  # a rebalance took a partition away while fetching
                continue
            except KafkaError as exc:
                raise self._error("reading failed", exc) from None
            if not membership.still_current(epoch):
                # A rebalance went by while fetching: what came back is dropped unread. Returning it
                # moved the position past it even when it came under the new assignment, so read
                # those partitions again from where this redrive or the group got to.
                await membership.wait_assigned()
                await membership.reposition([tp for tp, records in batches.items() if records])
                continue
            items = []
            for tp, records in batches.items():
                for record in records:
                    if tp in self._stopped or tp in self._done:
                        break
                    if record.offset >= self._ends[tp]:
                        self._done.add(tp)  # past the snapshot: this and what follows wait
                        break
                    items.append(self._item(record))
                    membership.next_offsets[tp] = record.offset + 1
            if items:
                membership.begin_batch()  # settled in remove or release before a rebalance goes on
                return items
            for tp in reading:  # nothing more within the snapshot
                try:
                    if tp not in batches and await consumer.position(tp) >= self._ends[tp]:
                        self._done.add(tp)
                except IllegalStateError:  # given away by a rebalance meanwhile: not this one's now
                    break

    async def _note_unreached(self) -> None:
        """
        Say so when partitions of the snapshot that the group gave another member (a concurrent
        redrive or dry run of this group) still hold records this redrive did not reach: it ended
        without them, and its summary's ``left`` is unknown rather than 0.
        """
        consumer = self._consumer
        assert consumer is not None
        elsewhere = [
            tp
            for tp in sorted(self._ends)
            if tp not in self._done and tp not in self._stopped and tp not in consumer.assignment()
        ]
        if not elsewhere:
            return
        unreached = []
        try:
            starts = await consumer.beginning_offsets(elsewhere)
            for tp in elsewhere:
                committed = await consumer.committed(tp)
                if self._ends[tp] > max(committed or 0, starts.get(tp, 0)):
                    unreached.append(tp.partition)
        except KafkaError:
            unreached = [tp.partition for tp in elsewhere]  # not known: not reached
        if unreached:
            self.reached_all = False
            log.warning(
                "Redrive group %s gave partition(s) %s of %r to another member: this redrive did not "
                "reach their records within its snapshot (left: unknown)",
                self._group_id,
                unreached,
                self._topic,
            )

    def _item(self, record: Any) -> RedriveItem:
        tp = TopicPartition(record.topic, record.partition)
        self._unsettled.setdefault(tp, []).append(record.offset)
        envelope = build_raw_message(record, DEFAULT_MAX_PAYLOAD_BYTES).envelope
        return RedriveItem(
            key=f"{record.partition}@{record.offset}",
            envelope=envelope,
            handle=record,
            leave=self._leave(record),
        )

    def _leave(self, record: Any) -> str | None:
        """Why this record must not be produced to its destination (the module docstring), or None."""
        origin = _header(record, ORIGIN_TOPIC_HEADER)
        if origin is None:
            return f"no {ORIGIN_TOPIC_HEADER} header: which topic it came from is not known"
        if self._targets is not None and origin not in self._targets:
            return f"dead-lettered from another topic ({origin}): redrive it to that topic"
        return None

    async def copy(self, items: Sequence[RedriveItem]) -> Sequence[RedriveItem]:
        producer = self._producer
        assert producer is not None
        sent: list[tuple[RedriveItem, Any]] = []
        refused: list[RedriveItem] = []
        for item in items:
            record = item.handle
            partition = TopicPartition(record.topic, record.partition)
            if partition in self._stopped:  # behind a refused record: not copied, not committed
                refused.append(item)
                continue
            target = _header(record, ORIGIN_TOPIC_HEADER)  # its home (left records never get here)
            if not target or record.value is None:  # a pointer is not the record it points to
                log.warning(
                    "Record %s of %s is not redriven, nor anything after it in its partition: %s",
                    item.key,
                    self._topic,
                    _pointer(record),
                )
                self._stopped.add(partition)
                refused.append(item)
                continue
            headers = [(n, v) for n, v in record.headers if self._keep or n not in OUR_HEADERS]
            try:
                delivery = await producer.send(target, value=record.value, key=record.key, headers=headers)
            except KafkaError as exc:
                log.warning("Kafka refused the copy of %s: %s", item.key, self._scrubber.describe(exc))
                self._stopped.add(partition)
                refused.append(item)
                continue
            sent.append((item, delivery))
        accepted = []
        for item, delivery in sent:
            try:
                await delivery
            except KafkaError as exc:
                log.warning("Kafka refused the copy of %s: %s", item.key, self._scrubber.describe(exc))
                refused.append(item)
                continue
            accepted.append(item)
        for item in refused:  # nothing at or after it is committed by this redrive
            record = item.handle
            self._stopped.add(TopicPartition(record.topic, record.partition))
        return accepted

    async def remove(self, moved: Sequence[RedriveItem], skipped: Sequence[RedriveItem]) -> None:
        # Only what the filter skipped is appended again, for this group's next redrive. A record
        # the origin rule leaves is another stream's: that stream's redrive reads the original with
        # its own group, so a copy here would reach it twice (and grow the topic each redrive).
        left = [item for item in skipped if item.leave is not None]
        appended = await self._append_again([item for item in skipped if item.leave is None])
        for item in (*moved, *appended, *left):
            record = item.handle
            self._handled.setdefault(TopicPartition(record.topic, record.partition), set()).add(record.offset)
        offsets: dict[TopicPartition, int] = {}
        for tp, pending in self._unsettled.items():
            handled = self._handled.get(tp, set())
            passed = 0
            while passed < len(pending) and pending[passed] in handled:
                passed += 1
            if passed:
                offsets[tp] = pending[passed - 1] + 1
                handled.difference_update(pending[:passed])
                del pending[:passed]
        try:
            if offsets:
                await self._commit(offsets)
        finally:
            assert self._membership is not None
            self._membership.end_batch()

    async def _commit(self, offsets: dict[TopicPartition, int]) -> None:
        """Commit as the group's member (:meth:`RedriveMembership.commit`); a failure fails the redrive."""
        assert self._membership is not None
        try:
            await self._membership.commit(offsets)
        except (KafkaError, TimeoutError) as exc:
            raise self._error(f"committing group {self._group_id!r} on {self._topic!r} failed", exc) from None

    async def _append_again(self, skipped: Sequence[RedriveItem]) -> list[RedriveItem]:
        """
        Append the skipped records to their partition's end (past the snapshot); return those the
        brokers acknowledged. One refused stops its partition like a refused copy: nothing from it
        on is committed, so the next redrive reads it again (never a crash loop, never a skip).
        """
        producer = self._producer
        assert producer is not None
        sent: list[tuple[RedriveItem, Any]] = []
        for item in skipped:
            record = item.handle
            partition = TopicPartition(record.topic, record.partition)
            if partition in self._stopped:
                continue
            try:
                delivery = await producer.send(
                    self._topic,
                    value=record.value,
                    key=record.key,
                    headers=list(record.headers),
                    partition=record.partition,
                )
            except KafkaError as exc:
                self._refuse_append(item, partition, exc)
                continue
            sent.append((item, delivery))
        appended = []
        for item, delivery in sent:
            try:
                await delivery
            except KafkaError as exc:
                self._refuse_append(item, TopicPartition(item.handle.topic, item.handle.partition), exc)
                continue
            appended.append(item)
        return appended

    def _refuse_append(self, item: RedriveItem, partition: TopicPartition, exc: KafkaError) -> None:
        log.warning(
            "Kafka refused to append skipped record %s to %s again: it stays, and nothing after it "
            "in its partition is committed by this redrive: %s",
            item.key,
            self._topic,
            self._scrubber.describe(exc),
        )
        self._stopped.add(partition)

    async def renew(self, items: Sequence[RedriveItem]) -> None:
        """Never called: a log holds nothing (``lease_seconds`` is ``None``)."""
        await asyncio.sleep(0)

    def held_handle(self, item: RedriveItem) -> Any:
        return item.handle

    async def release(self, items: Sequence[RedriveItem]) -> None:
        """Nothing to give back (a record not committed past is read again); forget their offsets."""
        for item in items:
            record = item.handle
            pending = self._unsettled.get(TopicPartition(record.topic, record.partition))
            if pending is not None and record.offset in pending:
                pending.remove(record.offset)
        if self._membership is not None:
            self._membership.end_batch()
        await asyncio.sleep(0)

    def _error(self, what: str, exc: BaseException) -> KafkaSharedStreamError:
        detail = self._scrubber.describe(exc) if self._scrubber is not None else type(exc).__name__
        return KafkaSharedStreamError(
            f"Kafka redrive of {self._topic!r} (connection {self._conn_id!r}): {what}: {detail}"
        )


def _pointer(record: Any) -> str:
    """What a record without a value is, and how to get the original it stands for."""
    where = "{}/{}@{}".format(*(_header(record, name) for name in ORIGIN_HEADERS))
    size = _header(record, SIZE_HEADER)
    return (
        f"a pointer record ({size or '?'} bytes were too large to dead-letter), not the original: "
        f"the original is at {where} until that topic's retention removes it; read it from there "
        "and produce it again"
    )


def _header(record: Any, name: str) -> str | None:
    """
    The LAST ``name`` header: our dead-lettering appends its origin headers after the record's own,
    and a record may carry a header of that name itself (a copy kept with its origin attributes, or
    one its producer wrote to send it elsewhere); only the one appended last is ours.
    """
    found = None
    for header, value in record.headers or ():
        if header == name and value is not None:
            found = bytes(value).decode("utf-8", errors="replace")
    return found


def dead_letter_source(**kwargs: Any) -> KafkaDeadLetterSource:
    return KafkaDeadLetterSource(**kwargs)
