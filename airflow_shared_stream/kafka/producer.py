"""
The broker half of a Kafka shared stream: one aiokafka consumer, settled per partition.

High availability: every triggerer's consumer reads every partition of the topics (manual
assignment: no group membership, so several triggerers never split the partitions between them),
and every watcher keeps its own durable position (:mod:`~airflow_shared_stream.kafka.watchers`,
:mod:`~airflow_shared_stream.kafka.positions`). Each partition starts at the lowest position of
the watchers this process serves; a watcher that joins behind seeks its partitions back.

One :class:`KafkaSharedStreamProducer` owns the consumer of one shared stream in the triggerer.
It fetches in batches (``getmany``) sized by the credit window, so no more than
``max_in_flight`` messages are ever yielded and unsettled, and subscriber queues cannot
overflow. Each message is its own raw event; its lane is its ``(topic, partition)``, so a slow
partition holds back only its own commits.

Settlement (see :mod:`airflow_shared_stream.common.settlement`):

* ACK: commit the highest offset of the lane below which everything is settled (cumulative),
  to the stream's group and, for each watcher, its own position over the records it received;
  sent by :mod:`~airflow_shared_stream.kafka.committer` tasks.
* DEAD_LETTER: produce the record (key, value, headers, plus origin headers) to
  ``dead_letter_topic`` and wait for the broker's acknowledgement, then commit past it. A record
  too large for the dead-letter topic goes as a pointer record. Without a dead-letter topic the
  record is logged and committed past, as Airflow's own producer does.
* REDELIVER: hold the offset as the lane's floor (nothing is committed at or past it) and seek
  the consumer back to it; see :mod:`airflow_shared_stream.kafka.offsets`.

Where it starts: at the lowest position of the watchers it serves; a partition without any has
its start committed, for the stream's group and for each watcher, before its first record is
read, so a restart or a move never skips what was produced after the stream first started.
Every ``POSITION_REFRESH_INTERVAL`` the stream's commits and every watcher's position are
committed again, unchanged, so an idle stream's positions never reach the broker's
``offsets.retention.minutes`` and expire into ``auto.offset.reset``; each watcher's commits carry
the consumer's shape, which that refresh checks against other triggerers (:mod:`.marks`). The
stream's own consumer is never rebalanced; :mod:`~airflow_shared_stream.kafka.ownership` still
guards a group-subscribed consumer an embedder gives to :meth:`KafkaSharedStreamProducer.attach`.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import logging
import time
from collections.abc import AsyncIterator, Hashable, Sequence
from typing import Any, NamedTuple

from airflow_shared_stream.common.errors import require_sdk

require_sdk("aiokafka", "kafka")

from aiokafka import (  # noqa: E402 - after the check that names the extra
    AIOKafkaConsumer,
    AIOKafkaProducer,
    TopicPartition,
)
from aiokafka.errors import (  # noqa: E402
    AuthenticationFailedError,
    AuthenticationMethodNotSupported,
    ClusterAuthorizationFailedError,
    GroupAuthorizationFailedError,
    IllegalSaslStateError,
    IllegalStateError,
    KafkaError,
    RebalanceInProgressError,
    SaslAuthenticationFailed,
    TopicAuthorizationFailedError,
    UnsupportedSaslMechanismError,
)
from airflow.triggers.shared_stream import AdvanceItem, SharedStreamProducer  # noqa: E402

from airflow_shared_stream.common import metrics as m  # noqa: E402
from airflow_shared_stream.common.errors import SecretScrubber  # noqa: E402
from airflow_shared_stream.common.flow_control import CreditWindow, yield_point  # noqa: E402
from airflow_shared_stream.common.matching import RawMessage, build_message  # noqa: E402
from airflow_shared_stream.common.metrics import StreamMetrics  # noqa: E402
from airflow_shared_stream.common.settlement import Settlement, decide, describe_batch  # noqa: E402
from airflow_shared_stream.common.trigger import (  # noqa: E402
    DEFAULT_MAX_IN_FLIGHT,
    DEFAULT_MAX_PAYLOAD_BYTES,
)
from airflow_shared_stream.kafka.committer import LOST_TO_REBALANCE, OffsetCommitter  # noqa: E402
from airflow_shared_stream.kafka.dead_letters import DeadLetterWriter  # noqa: E402
from airflow_shared_stream.kafka.errors import (  # noqa: E402
    KafkaAccessError,
    KafkaEndpointError,
    KafkaGroupConflictError,
    KafkaSharedStreamError,
    KafkaTopicNotFoundError,
)
from airflow_shared_stream.kafka.fair_fetch import fetch_evenly  # noqa: E402
from airflow_shared_stream.kafka.hook import KafkaHook  # noqa: E402
from airflow_shared_stream.kafka.identity import consumer_group_id, group_claims  # noqa: E402
from airflow_shared_stream.kafka.offsets import OffsetLedger  # noqa: E402
from airflow_shared_stream.kafka.ownership import PartitionOwnership  # noqa: E402
from airflow_shared_stream.kafka.positions import PositionStore  # noqa: E402
from airflow_shared_stream.kafka.watcher_positions import WatcherPositions  # noqa: E402
from airflow_shared_stream.kafka.watchers import stream_ref, watchers_of  # noqa: E402

log = logging.getLogger(__name__)

__all__ = ["KafkaBrokerPayload", "KafkaSharedStreamError", "KafkaSharedStreamProducer", "build_raw_message"]

POLL_TIMEOUT_MS = 500
"""How long one ``getmany`` waits for records; bounds how late a stop or a credit is noticed."""

FOLD_ACKS_AT = 32
"""ACK-only advances folded as soon as this many messages wait (else at the committer's round).

Folding coalesces well at any size (commits are coalesced by the committer either way); what
holding them longer costs is memory that lives too long: at 20,000 messages a second a 0.2 s
commit round kept ~4,000 advance items (with their payloads and outcomes) alive through two
garbage-collector generations, and the full collections of the triggerer's heap that followed
cost a fifth of the stream's time at one watcher (bench/results/watchers_kafka.md)."""

POSITION_REFRESH_INTERVAL = 60.0
"""Seconds between two commits of unchanged positions: far below any offsets retention, and the
liveness a position's mark shows to other triggerers (:data:`~.marks.LIVE_FOR` is five of them).
One ``OffsetFetch`` and one ``OffsetCommit`` per watcher per interval."""

ZERO_SUBSCRIBER_BACKOFF = 0.25
"""Pause before re-reading a message no subscriber was online for, instead of spinning on it."""


ACCESS_REFUSED = (
    AuthenticationFailedError,
    AuthenticationMethodNotSupported,
    ClusterAuthorizationFailedError,
    GroupAuthorizationFailedError,
    IllegalSaslStateError,
    SaslAuthenticationFailed,
    TopicAuthorizationFailedError,
    UnsupportedSaslMechanismError,
)
"""Errors meaning the cluster refused the connection's credentials or their permissions."""


class KafkaBrokerPayload(NamedTuple):
    """
    What :meth:`KafkaSharedStreamProducer.advance` needs to settle one record.

    ``epoch`` is the partition's assignment epoch when the record was read: a record from an
    earlier assignment belongs to another consumer now and is never committed here. ``key``,
    ``value`` and ``headers`` are kept only with a dead-letter topic, to re-produce the record.
    (A named tuple: one is built per message, and it is several times cheaper than a dataclass.)
    """

    topic: str
    partition: int
    offset: int
    epoch: int
    seq: int = 0
    """Yield sequence number: which watchers surely received it (see :mod:`.watchers`)."""
    key: bytes | None = None
    value: bytes | None = None
    headers: tuple[tuple[str, bytes], ...] = ()


def _text(data: bytes | None) -> str | None:
    """Header values and keys as text where they are UTF-8, else base64 (still JSON-able)."""
    if data is None:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return "base64:" + base64.b64encode(data).decode("ascii")


def build_raw_message(record: Any, max_payload_bytes: int) -> RawMessage:
    """
    Turn one aiokafka ``ConsumerRecord`` into the envelope every subscriber matches against.

    The common envelope builder, with Kafka's word for the body (``value``). A value that is not
    UTF-8 is unprocessable (dead-lettered with its bytes intact) rather than base64-encoded into
    the payload: Kafka values are often binary formats (Avro, Protobuf) that a JMESPath
    ``match`` cannot read anyway. The usual record, a JSON object within the payload limit, is
    built here directly: the same envelope :func:`build_message` makes, without its checks for
    the other cases, once per message.
    """
    key = record.key
    headers = record.headers
    value = record.value
    if value is not None and len(value) <= max_payload_bytes and value[:1] == b"{":
        try:
            body = json.loads(value.decode("utf-8"))
        except ValueError:  # not UTF-8 (UnicodeDecodeError is one) or not JSON: the general path
            pass
        else:
            return RawMessage(
                {
                    "value": body,
                    "topic": record.topic,
                    "partition": record.partition,
                    "offset": record.offset,
                    "timestamp": record.timestamp,
                    "key": None if key is None else _text(key),
                    "headers": {name: _text(data) for name, data in headers} if headers else {},
                },
                f"{record.topic}/{record.partition}@{record.offset}",
            )
    metadata = {
        "topic": record.topic,
        "partition": record.partition,
        "offset": record.offset,
        "timestamp": record.timestamp,
        "key": None if key is None else _text(key),  # most records have none: no call for them
        "headers": {name: _text(data) for name, data in headers} if headers else {},
    }
    return build_message(
        value,
        metadata=metadata,
        label=f"{record.topic}/{record.partition}@{record.offset}",
        max_payload_bytes=max_payload_bytes,
        binary="reject",
        body_field="value",
    )


class KafkaSharedStreamProducer(SharedStreamProducer):
    """
    One aiokafka consumer shared by every watcher of a stream key (see the module docstring).

    Built by :meth:`KafkaSharedStreamTrigger.create_shared_stream_producer`; connects only in
    :meth:`open_stream`.
    """

    def __init__(
        self,
        *,
        topics: Sequence[str],
        kafka_config_id: str = "kafka_default",
        group_id: str | None = None,
        dead_letter_topic: str | None = None,
        max_in_flight: int = DEFAULT_MAX_IN_FLIGHT,
        max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES,
        poll_timeout_ms: int = POLL_TIMEOUT_MS,
    ) -> None:
        self.topics = sorted(set(topics))
        self.kafka_config_id = kafka_config_id
        # The trigger's group_id, if any; the group actually used is resolved on connect, when
        # the connection's group.id (the prefix of a derived id) is known.
        self.requested_group_id = group_id
        self.group_id: str | None = group_id
        self.dead_letter_topic = dead_letter_topic
        self.max_payload_bytes = max_payload_bytes
        self.poll_timeout_ms = poll_timeout_ms
        self.credits = CreditWindow(max_in_flight)
        self.ledger = OffsetLedger()
        self.ownership = PartitionOwnership(self._assignment)
        self.committer = OffsetCommitter(
            commit=self._commit,
            owns=self.ownership.owns,
            describe_error=self._error,
            before_round=self.fold_advanced_acks,
            after_round=self._report_lag,
        )
        self._advanced_acks: list[Sequence[AdvanceItem]] = []
        """ACK-only batches advanced since the last fold (see :meth:`fold_advanced_acks`)."""
        self._advanced_ack_count = 0
        """Messages in :attr:`_advanced_acks` (folded at ``FOLD_ACKS_AT``)."""
        self.metrics = StreamMetrics("kafka", ".".join(self.topics))
        self._identity = (tuple(self.topics), kafka_config_id)
        self._claimed_group: str | None = None
        self._consumer: AIOKafkaConsumer | None = None
        self._dlq: AIOKafkaProducer | None = None
        self._scrubber = SecretScrubber()
        self.paused_until = 0.0
        """Monotonic time before which nothing is fetched (after a zero-subscriber broadcast)."""
        # Partitions assigned whose start position is not yet known to be committed.
        self._unanchored: set[TopicPartition] = set()
        self.watchers = watchers_of(stream_ref(self.topics, kafka_config_id, group_id))
        self.positions = WatcherPositions(
            self.watchers,
            topics=self.topics,
            shape={
                "dead_letter_topic": dead_letter_topic,
                "max_in_flight": max_in_flight,
                "max_payload_bytes": max_payload_bytes,
            },
            describe_error=self._error,
        )
        self._refresher: asyncio.Task[None] | None = None
        self._seq = 0
        """Sequence number of the next record yielded (stamped on its payload)."""

    @property
    def kafka_conn_id(self) -> str:
        """Deprecated alias of :attr:`kafka_config_id`."""
        return self.kafka_config_id

    def attach(
        self, consumer: AIOKafkaConsumer, dead_letter_producer: AIOKafkaProducer | None = None
    ) -> None:
        """
        Settle through these started clients. :meth:`open_stream` calls it after connecting;
        tests and embedders that bring their own clients call it instead.
        """
        self._consumer = consumer
        self._dlq = dead_letter_producer
        self.watchers.before_leave = self.fold_advanced_acks

    def _assignment(self) -> set[TopicPartition]:
        consumer = self._consumer
        return consumer.assignment() if consumer is not None else set()

    async def _commit(self, offsets: dict[TopicPartition, int]) -> None:
        if self._consumer is not None:
            await self._consumer.commit(offsets)

    # -- stream ---------------------------------------------------------------------------

    async def open_stream(self) -> AsyncIterator[tuple[RawMessage, KafkaBrokerPayload]]:
        consumer = await self._connect()
        self.committer.start()
        if self._refresher is None:
            self._refresher = asyncio.create_task(self._refresh_positions(), name="kafka-position-refresh")
        keep_record = self.dead_letter_topic is not None
        ownership, credits, metrics = self.ownership, self.credits, self.metrics
        while True:
            if self.committer.error is not None:
                raise self.committer.error
            available = credits.available or await self._wait_for_credit(consumer)
            delay = self.paused_until - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            await self._anchor_start_positions(consumer)
            if self.watchers.pending:
                await self.positions.admit(consumer, self.ownership, self._seq)
            try:
                fetched = await fetch_evenly(consumer, available, self.poll_timeout_ms)
            except KafkaError as exc:
                raise self._error("reading from Kafka failed", exc) from None
            for tp, records in fetched.items():
                if tp in self._unanchored and records:
                    # Assigned during this fetch: anchor at the first record, before it is yielded.
                    await self._anchor(consumer, tp, records[0].offset)
                fetch_epochs = ownership.fetch_epochs
                fetch_epoch = fetch_epochs.get(tp, 0)
                epoch = ownership.epoch(tp)
                metrics.incr(m.RECEIVED, len(records))
                for record in records:
                    if fetch_epochs.get(tp, 0) != fetch_epoch:
                        break  # sought back or revoked meanwhile: the rest is stale
                    seq = self._seq
                    self._seq = seq + 1
                    if keep_record:
                        payload = KafkaBrokerPayload(
                            record.topic,
                            record.partition,
                            record.offset,
                            epoch,
                            seq,
                            record.key,
                            record.value,
                            tuple(record.headers or ()),
                        )
                    else:
                        payload = KafkaBrokerPayload(
                            record.topic, record.partition, record.offset, epoch, seq
                        )
                    credits.take()
                    yield build_raw_message(record, self.max_payload_bytes), payload
                    # Let the subscribers take each message before the next one. Measured with
                    # the real manager: yielding a whole fetch in one burst is slower (the
                    # manager's per-event work does not batch), although the window alone
                    # already rules out a queue overflow.
                    await yield_point()
            if fetched:
                metrics.gauge(m.IN_FLIGHT, credits.in_flight)

    async def _wait_for_credit(self, consumer: AIOKafkaConsumer) -> int:
        """
        Wait for a credit while keeping this consumer a live member of its group.

        aiokafka leaves the group when ``getmany`` is not called for ``max.poll.interval.ms``;
        the partitions would be revoked with everything in flight, which the next owner then
        reads again. A full window can last that long when the metadata database is slow, so
        while it does the consumer keeps polling with every partition paused: no record comes
        back, the member stays alive.
        """
        self.metrics.incr(m.CREDIT_WAITS)
        paused: set[TopicPartition] = set()
        try:
            while True:
                with contextlib.suppress(TimeoutError):
                    return await asyncio.wait_for(self.credits.wait_for_credit(), self.poll_timeout_ms / 1000)
                # A rebalance may have assigned partitions since the last pass: pause them too.
                fresh = consumer.assignment() - paused
                consumer.pause(*fresh)
                paused |= fresh
                try:
                    fetched = await consumer.getmany(timeout_ms=0)
                except KafkaError as exc:
                    raise self._error("reading from Kafka failed", exc) from None
                for tp, records in fetched.items():
                    # Assigned between the pause and the poll: put the records back.
                    if records:
                        if tp in self._unanchored:
                            await self._anchor(consumer, tp, records[0].offset)
                        self.ownership.rewound(tp)
                        consumer.seek(tp, records[0].offset)
        finally:
            still_assigned = paused & consumer.assignment()
            if still_assigned:
                consumer.resume(*still_assigned)

    async def _anchor_start_positions(self, consumer: AIOKafkaConsumer) -> None:
        """Commit the start position of every newly assigned partition that has no commit."""
        for tp in list(self._unanchored):
            if tp not in consumer.assignment():
                self._unanchored.discard(tp)
                continue
            try:
                position = await consumer.position(tp)
            except (IllegalStateError, RebalanceInProgressError):
                continue  # revoked meanwhile; the next assignment anchors it
            except KafkaError as exc:
                raise self._error(
                    f"reading the start position of {tp.topic}/{tp.partition} failed", exc
                ) from None
            await self._anchor(consumer, tp, position)

    async def _anchor(self, consumer: AIOKafkaConsumer, tp: TopicPartition, position: int) -> None:
        """
        Make ``position`` the group's committed offset of ``tp`` if the group has none yet.

        A group without a commit starts wherever ``auto.offset.reset`` points *each time* a
        consumer starts; with ``latest`` a restart skips whatever was produced while the stream
        was down, and a record read but not yet settled is skipped too. Committing the first
        position makes the first start the one every later start resumes from. Runs before any
        record of the partition is yielded, so nothing at or past ``position`` has been settled.
        """
        self._unanchored.discard(tp)
        try:
            committed = await consumer.committed(tp)
            if committed is not None:
                self.committer.seed({tp: committed}, self.ownership.epoch(tp))
                return
            await consumer.commit({tp: position})
            self.committer.seed({tp: position}, self.ownership.epoch(tp))
        except LOST_TO_REBALANCE as exc:
            # Lost to a rebalance: the partition's next owner anchors it.
            log.info("Start position of %s/%d not committed (%s)", tp.topic, tp.partition, type(exc).__name__)
            return
        except KafkaError as exc:
            raise self._error(
                f"committing the start position of {tp.topic}/{tp.partition} failed", exc
            ) from None
        log.info(
            "Kafka group %r had no commit for %s/%d: committed its start offset %d",
            self.group_id,
            tp.topic,
            tp.partition,
            position,
        )

    async def _connect(self) -> AIOKafkaConsumer:
        config = await KafkaHook(self.kafka_config_id).aget_client_config()
        self._scrubber = config.scrubber()
        group_id = consumer_group_id(
            self.topics,
            self.kafka_config_id,
            group_id=self.requested_group_id,
            connection_group_id=config.group_id,
        )
        try:
            group_claims.claim(group_id, self._identity)
        except ValueError as exc:
            raise KafkaGroupConflictError(str(exc)) from None
        self._claimed_group = group_id
        self.group_id = group_id
        servers = ",".join(config.common["bootstrap_servers"])
        consumer = AIOKafkaConsumer(**config.consumer_kwargs(group_id))
        self.attach(consumer)
        try:
            await consumer.start()
        except Exception as exc:
            kind = KafkaAccessError if isinstance(exc, ACCESS_REFUSED) else KafkaEndpointError
            raise self._error(f"cannot connect to Kafka at {servers}", exc, kind=kind) from None
        try:
            existing = await consumer.topics()
        except KafkaError as exc:
            raise self._error(f"cannot read topic metadata from {servers}", exc) from None
        missing = sorted(set(self.topics) - set(existing))
        if missing:
            raise KafkaTopicNotFoundError(
                f"Kafka topic(s) {', '.join(missing)} do not exist on {servers} "
                f"(connection {self.kafka_config_id!r}); create them first"
            )
        if self.dead_letter_topic is not None:
            if self.dead_letter_topic not in existing:
                raise KafkaTopicNotFoundError(
                    f"dead-letter topic {self.dead_letter_topic!r} does not exist on {servers}"
                )
            dlq = AIOKafkaProducer(**config.producer_kwargs())
            self.attach(consumer, dlq)
            try:
                await dlq.start()
            except Exception as exc:
                raise self._error(f"cannot start the dead-letter producer for {servers}", exc) from None
        lanes = [
            TopicPartition(topic, partition)
            for topic in self.topics
            for partition in sorted(consumer.partitions_for_topic(topic) or ())
        ]
        # Every partition, in every triggerer: no membership, so nothing is ever split.
        consumer.assign(lanes)
        self.positions.bind(PositionStore(consumer._client), group_id, lanes)
        await self.positions.admit(consumer, self.ownership, self._seq, starting=True)
        self._unanchored |= set(lanes)
        log.info(
            "Kafka shared stream reading all %d partition(s) of %s (group %r, connection %r), %d watcher(s)",
            len(lanes),
            ",".join(self.topics),
            group_id,
            self.kafka_config_id,
            len(self.watchers.admitted()),
        )
        return consumer

    # -- watchers -------------------------------------------------------------------------

    async def _refresh_positions(self) -> None:
        """
        Every ``POSITION_REFRESH_INTERVAL``, commit the stream's and every live watcher's position
        again, unchanged.

        A broker expires a member-less group's offsets ``offsets.retention.minutes`` after their
        last commit, and an idle stream commits nothing: without this, a restart or a failover
        after a quiet week would start at ``auto.offset.reset``. Each watcher's position is read
        first, so a consumer of another shape on another triggerer is found within a round.
        """
        while True:
            await asyncio.sleep(POSITION_REFRESH_INTERVAL)
            self.committer.refresh()
            await self.positions.refresh()

    def _error(
        self, what: str, exc: BaseException, *, kind: type[KafkaSharedStreamError] = KafkaSharedStreamError
    ) -> KafkaSharedStreamError:
        """Wrap a client error with context, scrubbed of any secret of the connection."""
        return kind(f"{what} (connection {self.kafka_config_id!r}): {self._scrubber.describe(exc)}")

    # -- rebalance ------------------------------------------------------------------------

    async def on_partitions_revoked(self, revoked: Any) -> None:
        """
        Partitions taken away: commit what is settled, then disown what is still in flight.

        The stream's own consumer is manually assigned and never loses a partition; this (and
        :meth:`on_partitions_assigned`) serve a group-subscribed consumer given to :meth:`attach`
        by an embedder, as a ``ConsumerRebalanceListener`` would call them.
        """
        # Commit what is settled while the partitions are still ours: fewer redeliveries.
        try:
            await self.committer.flush(only=set(revoked))
        except Exception as exc:  # never let a listener error break the rebalance
            log.warning("Commit before revoke failed: %s", type(exc).__name__)
        self.ownership.revoked(revoked)
        for tp in revoked:
            self._unanchored.discard(tp)
            self.ledger.forget((tp.topic, tp.partition))
        if revoked:
            log.info(
                "Kafka partitions revoked: %s", ", ".join(f"{tp.topic}/{tp.partition}" for tp in revoked)
            )

    def on_partitions_assigned(self, assigned: Any) -> None:
        """Partitions given: their start positions are anchored before reading (see above)."""
        self._unanchored |= set(assigned)
        if assigned:
            log.info(
                "Kafka partitions assigned: %s", ", ".join(f"{tp.topic}/{tp.partition}" for tp in assigned)
            )

    # -- advance --------------------------------------------------------------------------

    def get_advance_lane(self, broker_payload: KafkaBrokerPayload) -> Hashable:
        return broker_payload.topic, broker_payload.partition

    async def advance(self, batch: Sequence[AdvanceItem]) -> None:
        """
        Settle one partition's resolved prefix (see the module docstring).

        A batch of ACKs only is kept for :meth:`fold_advanced_acks`. Otherwise the earlier ACKs
        are folded first, dead letters are produced and acknowledged by the broker here, before
        the commit that passes them is even queued, and the lane is folded. The commit itself
        is sent by the committer task.
        """
        # Every advanced message returns its credit, whatever happens below. (The in-flight
        # gauge is set where messages are fetched and folded, not on every advance.)
        self.credits.release(len(batch))
        if self.committer.error is not None:
            raise self.committer.error
        for item in batch:
            outcome = item.outcome
            if outcome.failed or outcome.rejected or not outcome.acked:
                break  # not all ACKs (see settlement.decide)
        else:
            # All ACKs, the common case: kept for the committer's next round, which the first
            # of them wakes (one wakeup per round, not per advance).
            advanced = self._advanced_acks
            if not advanced:
                self.committer.wake()
            advanced.append(batch)
            self._advanced_ack_count += len(batch)
            if self._advanced_ack_count >= FOLD_ACKS_AT:
                self.fold_advanced_acks()
            return
        self.fold_advanced_acks()  # a lane's earlier ACKs are folded before this batch
        first: KafkaBrokerPayload = batch[0].broker_payload
        tp = TopicPartition(first.topic, first.partition)
        current = self._settleable(tp, batch)
        if current is None:
            return
        epoch, batch = current
        dead = [item.broker_payload for item in batch if decide(item.outcome) is Settlement.DEAD_LETTER]
        if dead:
            with self.metrics.timed(m.ADVANCE_LATENCY):  # the one broker call an advance makes
                await self._dead_letter(dead)
            # The send suspended this advance: a rebalance may have revoked the partition and
            # cleared its lane meanwhile. Settle only a lane that is still the one read from.
            if not self.ownership.owns(tp, epoch):
                log.info(
                    "Not settling %d message(s) of %s/%d: revoked while dead-lettering; the "
                    "partition's next owner reads them again from the last commit",
                    len(batch),
                    tp.topic,
                    tp.partition,
                )
                return
        self._fold(tp, epoch, batch)

    def fold_advanced_acks(self) -> None:
        """
        Fold the ACK-only batches advanced since the last call into commit targets and positions.

        With persistence confirmed per event, the manager advances one message at a time, and
        folding each on its own (ledger, commit target, every watcher's position, metrics) cost
        more than the rest of the message's way through the stream. An ACK needs nothing from
        the broker, so ``advance`` only keeps it, and the committer calls this before each
        round (every ``COMMIT_INTERVAL``), before a flush, and :meth:`advance` before any batch
        that is not all ACKs, so each lane is still folded in advance order. The partition
        checks run here, on the state at fold time: a batch of a partition revoked meanwhile is
        left to its next owner, as it would have been had the revoke come first.
        """
        pending, self._advanced_acks = self._advanced_acks, []
        self._advanced_ack_count = 0
        lanes: dict[tuple[str, int], list[AdvanceItem]] = {}
        for batch in pending:
            first: KafkaBrokerPayload = batch[0].broker_payload
            lane = lanes.get((first.topic, first.partition))
            if lane is None:
                lanes[(first.topic, first.partition)] = list(batch)
            else:
                lane.extend(batch)
        for (topic, partition), items in lanes.items():
            tp = TopicPartition(topic, partition)
            current = self._settleable(tp, items)
            if current is not None:
                self._fold_acks(tp, *current)

    def _settleable(
        self, tp: TopicPartition, batch: Sequence[AdvanceItem]
    ) -> tuple[int, Sequence[AdvanceItem]] | None:
        """The partition's epoch and the items of ``batch`` read under it, or ``None`` if not ours."""
        first: KafkaBrokerPayload = batch[0].broker_payload
        epoch = self.ownership.epoch(tp)
        if first.epoch != epoch:
            # Read before the partition was last revoked: its owner since then reads them again
            # from the last commit. Later items of the lane may be fresh reads (same batch).
            fresh = [item for item in batch if item.broker_payload.epoch == epoch]
            log.info(
                "Not settling %d message(s) of %s/%d read before a rebalance: the partition's "
                "owner since then reads them again from the last commit",
                len(batch) - len(fresh),
                first.topic,
                first.partition,
            )
            batch = fresh
            if not batch:
                return None
        if not self.ownership.owns(tp, epoch):
            log.info(
                "Not settling %d message(s) of %s/%d: the partition is not assigned here now",
                len(batch),
                first.topic,
                first.partition,
            )
            return None
        return epoch, batch

    def _fold_acks(self, tp: TopicPartition, epoch: int, batch: Sequence[AdvanceItem]) -> None:
        """
        :meth:`_fold` for a lane of ACKs only, as :meth:`fold_advanced_acks` folds: the same effect.

        Nearly every message of a stream goes this way (every watcher took it), so nothing is
        decided or counted per settlement, and nothing can be held back or sought.
        """
        settled = [item.broker_payload for item in batch]
        commit = self.ledger.settle_acks((tp.topic, tp.partition), [payload.offset for payload in settled])
        self._settle_lane(tp, epoch, batch, commit, None, settled)
        metrics = self.metrics
        metrics.incr(m.FANNED_OUT, sum(item.outcome.acked for item in batch))
        metrics.incr(m.ACKED, len(batch))
        metrics.gauge(m.IN_FLIGHT, self.credits.in_flight)

    def _fold(self, tp: TopicPartition, epoch: int, batch: Sequence[AdvanceItem]) -> None:
        """Settle a lane's items (dead letters already sent): commit target, positions, seek, metrics."""
        items: list[tuple[int, Settlement]] = []
        settled: list[KafkaBrokerPayload] = []
        counts = dict.fromkeys(Settlement, 0)
        nobody = resolved = failed = failed_messages = 0
        for item in batch:
            outcome = item.outcome
            settlement = decide(outcome)
            counts[settlement] += 1
            resolved += outcome.acked + outcome.failed + outcome.rejected
            if outcome.failed:
                failed += outcome.failed
                failed_messages += 1
            if (
                settlement is Settlement.REDELIVER
                and outcome.acked == outcome.failed == outcome.rejected == 0
            ):
                # Nobody was subscribed: do not spin re-reading it until somebody is.
                self.paused_until = time.monotonic() + ZERO_SUBSCRIBER_BACKOFF
                nobody += 1
            payload = item.broker_payload
            items.append((payload.offset, settlement))
            if settlement is not Settlement.REDELIVER:
                settled.append(payload)
        action = self.ledger.settle((tp.topic, tp.partition), items)
        self._settle_lane(tp, epoch, batch, action.commit, action.seek, settled)
        metrics = self.metrics
        metrics.incr(m.FANNED_OUT, resolved)
        metrics.incr(m.ACKED, counts[Settlement.ACK])
        metrics.incr(m.REDELIVERED, counts[Settlement.REDELIVER])
        metrics.incr(m.DEAD_LETTERED, counts[Settlement.DEAD_LETTER])
        metrics.incr(m.NO_SUBSCRIBER, nobody)
        metrics.gauge(m.IN_FLIGHT, self.credits.in_flight)
        metrics.failed_deliveries(failed, failed_messages)

    def _settle_lane(
        self,
        tp: TopicPartition,
        epoch: int,
        batch: Sequence[AdvanceItem],
        commit: int | None,
        seek: int | None,
        settled: list[KafkaBrokerPayload],
    ) -> None:
        """Carry out a folded lane's settlement: queue its commit, move watchers over ``settled``, seek."""
        if log.isEnabledFor(logging.DEBUG):
            log.debug(
                "Kafka advance %s/%d %s -> commit %s, seek %s",
                tp.topic,
                tp.partition,
                describe_batch(batch),
                commit,
                seek,
            )
        if commit is not None:
            self.committer.queue(tp, commit, epoch)
        if settled and self.watchers.cursors:
            self.positions.advance(tp, settled)
        consumer = self._consumer
        if seek is not None and consumer is not None:
            self.ownership.rewound(tp)
            consumer.seek(tp, seek)
            log.info("Redelivering %s/%d from offset %d", tp.topic, tp.partition, seek)

    async def _report_lag(self) -> None:
        """Broker lag: the partitions' end offsets (as last fetched) minus the committed offsets."""
        consumer = self._consumer
        if consumer is None:
            return
        lag = 0
        for tp in consumer.assignment():
            end = consumer.highwater(tp)
            committed = self.ledger.committed((tp.topic, tp.partition))
            if end is not None and committed is not None:
                lag += max(0, end - committed)
        self.metrics.gauge(m.BROKER_LAG, lag)

    # -- dead letters ---------------------------------------------------------------------

    async def _dead_letter(self, payloads: list[KafkaBrokerPayload]) -> None:
        """Produce ``payloads`` to the dead-letter topic, acknowledged (see :mod:`.dead_letters`)."""
        if self.dead_letter_topic is None or self._dlq is None:
            for payload in payloads:
                log.warning(
                    "Dropping rejected message %s/%d@%d: no dead_letter_topic configured",
                    payload.topic,
                    payload.partition,
                    payload.offset,
                )
            return
        await DeadLetterWriter(self._dlq, self.dead_letter_topic, self._error).write(payloads)

    # -- close ----------------------------------------------------------------------------

    async def aclose(self) -> None:
        refresher, self._refresher = self._refresher, None
        if refresher is not None:
            refresher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await refresher
        if self._claimed_group is not None:
            group_claims.release(self._claimed_group, self._identity)
            self._claimed_group = None
        if self.watchers.before_leave == self.fold_advanced_acks:
            self.watchers.before_leave = None
        await self.committer.stop()
        # Every watcher's last position reaches the broker before the client goes: the ones that
        # left (their final send runs in the background) and the ones still here.
        await self.positions.stop()
        dlq, self._dlq = self._dlq, None
        consumer, self._consumer = self._consumer, None
        if dlq is not None:
            try:
                await dlq.stop()
            except Exception as exc:
                log.warning("Stopping the dead-letter producer failed: %s", type(exc).__name__)
        if consumer is not None:
            try:
                await consumer.stop()
            except Exception as exc:
                log.warning("Stopping the Kafka consumer failed: %s", type(exc).__name__)
        self.metrics.flush()  # what was counted since the last interval
