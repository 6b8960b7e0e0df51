"""
The broker half of a Kafka shared stream: one aiokafka consumer that reads every partition.

Every triggerer's consumer is assigned every partition of the topics (no group membership, so
several triggerers never split them), and every watcher keeps its own durable position
(:mod:`.watchers`, :mod:`.watcher_positions`). Each partition starts at the lowest position of
the watchers this process serves, and a partition without any has its start committed before its
first record is read (:mod:`.anchors`).

Records are taken from the consumer's buffer a few per partition at a time, shared between the
partitions (:mod:`.fair_fetch`), and never more than the credit window allows, so no more than
``max_in_flight`` are ever yielded and unsettled. Each record is its own raw event (the envelope
is :mod:`.envelope`'s); its lane is its ``(topic, partition)``, settled by :mod:`.settler`:

* ACK: commit the lane's offset below which everything is settled (cumulative), for the stream's
  group and for each watcher over the records it received; sent by :mod:`.committer` tasks.
* DEAD_LETTER: produce the record to ``dead_letter_topic`` and wait for the broker's
  acknowledgement (:mod:`.dead_letters`), then commit past it. Without a dead-letter topic the
  record is logged and committed past, as Airflow's own producer does.
* REDELIVER: hold the offset as the lane's floor and seek back to it (:mod:`.offsets`).

Every ``POSITION_REFRESH_INTERVAL`` the stream's and every watcher's positions are committed
again, unchanged, so an idle stream's positions never expire (``offsets.retention.minutes``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Hashable, Sequence

from airflow_shared_stream.common.errors import require_sdk

require_sdk("aiokafka", "kafka")

from aiokafka import (  # noqa: E402 - after the check that names the extra
    AIOKafkaConsumer,
    AIOKafkaProducer,
    TopicPartition,
)
from aiokafka.consumer.fetcher import OffsetResetStrategy  # noqa: E402
from aiokafka.errors import (  # noqa: E402
    KafkaError,
    NoOffsetForPartitionError,
    OffsetOutOfRangeError,
)
from airflow.triggers.shared_stream import AdvanceItem, SharedStreamProducer  # noqa: E402

from airflow_shared_stream.common import metrics as m  # noqa: E402
from airflow_shared_stream.common.figures import stream_figures  # noqa: E402
from airflow_shared_stream.common.flow_control import CreditWindow, yield_point  # noqa: E402
from airflow_shared_stream.common.leased_queue import NoSubscriberBackoff  # noqa: E402
from airflow_shared_stream.common.matching import RawMessage  # noqa: E402
from airflow_shared_stream.common.metrics import StreamMetrics  # noqa: E402
from airflow_shared_stream.common.settlement import Settlement, decide  # noqa: E402
from airflow_shared_stream.common.trigger import (  # noqa: E402
    DEFAULT_MAX_IN_FLIGHT,
    DEFAULT_MAX_PAYLOAD_BYTES,
)
from airflow_shared_stream.kafka.anchors import StartAnchors  # noqa: E402
from airflow_shared_stream.kafka.cluster_watch import ClusterWatch  # noqa: E402
from airflow_shared_stream.kafka.commit_guard import CommitGuard  # noqa: E402
from airflow_shared_stream.kafka.committer import OffsetCommitter  # noqa: E402
from airflow_shared_stream.kafka.dead_letter import (  # noqa: E402
    DeadLetterWriter,
    start_dead_letter_producer,
)
from airflow_shared_stream.kafka.envelope import KafkaBrokerPayload, build_raw_message  # noqa: E402
from airflow_shared_stream.kafka.errors import (  # noqa: E402
    KafkaErrorTranslator,
    KafkaSharedStreamError,
    KafkaTopicNotFoundError,
    login_refusal_behind,
)
from airflow_shared_stream.kafka.fair_fetch import fetch_evenly  # noqa: E402
from airflow_shared_stream.kafka.hook import KafkaSharedStreamHook  # noqa: E402
from airflow_shared_stream.kafka.identity import consumer_group_id, group_claims  # noqa: E402
from airflow_shared_stream.kafka.lag import broker_lag, watcher_lag  # noqa: E402
from airflow_shared_stream.kafka.log_bounds import (  # noqa: E402
    place_off_the_log,
    place_stream_starts,
)
from airflow_shared_stream.kafka.positions import PositionStore  # noqa: E402
from airflow_shared_stream.kafka.settler import LaneSettler  # noqa: E402
from airflow_shared_stream.kafka.topic_memory import TopicMemory  # noqa: E402
from airflow_shared_stream.kafka.watcher_positions import WatcherPositions  # noqa: E402
from airflow_shared_stream.kafka.watchers import stream_ref, watchers_of  # noqa: E402

log = logging.getLogger(__name__)

__all__ = ["KafkaBrokerPayload", "KafkaSharedStreamError", "KafkaSharedStreamProducer", "build_raw_message"]

POLL_TIMEOUT_MS = 500
"""How long one ``getmany`` waits for records; bounds how late a stop or a credit is noticed."""

POSITION_REFRESH_INTERVAL = 60.0
LAG_NOTE_INTERVAL = 1.0
"""Least time between two notes of the watchers' lag after a fetch (the page shows it every 5 s)."""
"""Seconds between two commits of unchanged positions: far below any offsets retention, and the
liveness a position's mark shows to other triggerers (:data:`~.marks.LIVE_FOR` is five of them)."""


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
        self.metrics = StreamMetrics("kafka", ".".join(self.topics))
        self.backoff = NoSubscriberBackoff()
        self._error = KafkaErrorTranslator(kafka_config_id)
        self.committer = OffsetCommitter(
            commit=self._commit,
            describe_error=self._error,
            before_round=self.fold_advanced_acks,
            after_round=self._report_lag,
        )
        self.anchors = StartAnchors(self.committer, self._error)
        self.fetch_epochs: dict[TopicPartition, int] = {}
        self._lag_noted_at = 0.0
        """Bumped on every seek of a partition: records fetched before it are stale, not yielded."""
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
        self.settler = LaneSettler(
            committer=self.committer,
            positions=self.positions,
            metrics=self.metrics,
            credits=self.credits,
            backoff=self.backoff,
            seek=self._rewind,
        )
        self.ledger = self.settler.ledger
        self._identity = (tuple(self.topics), kafka_config_id)
        self._claimed_group: str | None = None
        self._consumer: AIOKafkaConsumer | None = None
        self._dlq: AIOKafkaProducer | None = None
        self._refresher: asyncio.Task[None] | None = None
        self._seq = self.watchers.first_seq()
        """Sequence number of the next record yielded (stamped on its payload and message)."""
        self.cluster = ClusterWatch(self.topics)
        self.memory = TopicMemory(self.watchers, self.topics, self.positions)  # ids, new logs
        self.guard = self.positions.guard = CommitGuard(self.cluster, self.memory)
        self._offset_reset = "latest"
        """The connection's ``auto.offset.reset``, applied by :meth:`_off_the_log`."""
        self.renewed_at = self.settler.renewed_at
        """Per lane created again: the first sequence number of its new log (the settler's)."""

    @property
    def kafka_conn_id(self) -> str:
        """Deprecated alias of :attr:`kafka_config_id`."""
        return self.kafka_config_id

    def attach(
        self, consumer: AIOKafkaConsumer, dead_letter_producer: AIOKafkaProducer | None = None
    ) -> None:
        """Settle through these started clients (:meth:`open_stream` calls it after connecting)."""
        self._consumer = consumer
        self._dlq = dead_letter_producer
        self.watchers.before_leave = self.fold_advanced_acks

    async def _commit(self, offsets: dict[TopicPartition, int]) -> None:
        store, group = self.positions.store, self.positions.stream_group
        offsets = await self.guard.admit(offsets)  # never on a topic created again meanwhile
        if store is not None and group is not None:  # a gone topic's lane is dropped, not retried for ever
            await store.commit_asking_again(group, offsets)
        elif self._consumer is not None and offsets:
            await self._consumer.commit(offsets)
        self.guard.committed(offsets)

    def _rewind(self, tp: TopicPartition, offset: int) -> None:
        """Seek ``tp`` back to ``offset``; what was fetched before is stale."""
        consumer = self._consumer
        if consumer is not None:
            self.fetch_epochs[tp] = self.fetch_epochs.get(tp, 0) + 1
            consumer.seek(tp, offset)

    # -- stream ---------------------------------------------------------------------------

    async def open_stream(self) -> AsyncIterator[tuple[RawMessage, KafkaBrokerPayload]]:
        consumer = await self._connect()
        self.committer.start()
        if self._refresher is None:
            self._refresher = asyncio.create_task(self._refresh_positions(), name="kafka-position-refresh")
        keep_record = self.dead_letter_topic is not None
        credits, metrics, anchors = self.credits, self.metrics, self.anchors
        fetch_epochs = self.fetch_epochs
        while True:
            if self.committer.error is not None:
                raise self.committer.error
            available = credits.available or await self._wait_for_credit()
            await self.backoff.wait()
            await anchors.anchor_all(consumer)
            if self.cluster.due():
                await self.cluster.follow(consumer, self)
            if self.watchers.pending or self.positions.recalled:
                await self.positions.admit(consumer, self._rewind, self._seq)
            try:
                fetched = await fetch_evenly(consumer, available, self.poll_timeout_ms)
            except (OffsetOutOfRangeError, NoOffsetForPartitionError) as exc:
                await self._off_the_log(consumer, exc)
                continue
            except KafkaError as exc:
                raise self._error("reading from Kafka failed", exc) from None
            for tp, records in fetched.items():
                if tp in anchors.unanchored and records:
                    # Assigned during this fetch: anchor at the first record, before it is yielded.
                    await anchors.anchor(consumer, tp, records[0].offset)
                fetch_epoch = fetch_epochs.get(tp, 0)
                metrics.incr(m.RECEIVED, len(records))
                for record in records:
                    if fetch_epochs.get(tp, 0) != fetch_epoch:
                        break  # sought back meanwhile: the rest is stale
                    seq = self._seq
                    self._seq = seq + 1
                    if keep_record:
                        payload = KafkaBrokerPayload(
                            record.topic,
                            record.partition,
                            record.offset,
                            seq,
                            record.key,
                            record.value,
                            tuple(record.headers or ()),
                        )
                    else:
                        payload = KafkaBrokerPayload(record.topic, record.partition, record.offset, seq)
                    credits.take()
                    message = build_raw_message(record, self.max_payload_bytes)
                    message.seq = seq
                    yield message, payload
                    # Let the subscribers take each message before the next one: the manager's
                    # per-event work does not batch, so yielding a whole fetch at once is slower.
                    await yield_point()
            if fetched:
                metrics.gauge(m.IN_FLIGHT, credits.in_flight)
                self._note_lag(consumer)

    async def _wait_for_credit(self) -> int:
        """Wait until a message is settled (the whole window is in flight)."""
        self.metrics.incr(m.CREDIT_WAITS)
        return await self.credits.wait_for_credit()

    async def _connect(self) -> AIOKafkaConsumer:
        config = await KafkaSharedStreamHook(self.kafka_config_id).aget_client_config()
        self._error.scrubber = config.scrubber()
        group_id = consumer_group_id(
            self.topics,
            self.kafka_config_id,
            group_id=self.requested_group_id,
            connection_group_id=config.group_id,
        )
        group_claims.claim(group_id, self._identity)
        self._claimed_group = group_id
        self.group_id = self.anchors.group_id = group_id
        servers = ",".join(config.common["bootstrap_servers"])
        consumer = AIOKafkaConsumer(**config.consumer_kwargs(group_id))
        self.attach(consumer)
        try:
            await consumer.start()
        except Exception as exc:
            cause = await login_refusal_behind(consumer._client, exc)
            raise self._error.connect_failed(servers, cause) from None
        self._offset_reset = config.consumer["auto_offset_reset"]
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
            try:
                dlq = await start_dead_letter_producer(config.producer_kwargs(), self.dead_letter_topic)
            except Exception as exc:
                raise self._error(f"cannot start the dead-letter producer for {servers}", exc) from None
            self.attach(consumer, dlq)
        lanes = [
            TopicPartition(topic, partition)
            for topic in self.topics
            for partition in sorted(consumer.partitions_for_topic(topic) or ())
        ]
        # Every partition, in every triggerer: no membership, so nothing is ever split.
        consumer.assign(lanes)
        store = PositionStore(consumer._client)
        self.guard.bind(consumer._client)
        self.positions.bind(store, group_id, lanes)
        placed: set[TopicPartition] = set()

        def place_lane(tp: TopicPartition, offset: int) -> None:
            placed.add(tp)
            self._rewind(tp, offset)

        try:  # read through the store, which asks a loading coordinator again
            await self.cluster.look(consumer)
            self.positions.end_shows_new_topics = not self.cluster.has_topic_ids
            committed = await store.fetch(group_id, lanes)
            await place_stream_starts(
                consumer,
                committed.offsets,
                lanes,
                whose=f"the stream (group {group_id!r})",
                seek=place_lane,
                commit=consumer.commit,
                end_shows_new_topics=not self.cluster.has_topic_ids,
            )
            if self._offset_reset != "none":
                # From here on a position the log does not hold is placed by the stream
                # (:meth:`_off_the_log`), never reset by the client: below the log start,
                # ``latest`` would skip what retention kept. The lanes left to
                # ``auto.offset.reset`` are reset now, explicitly.
                unplaced = [tp for tp in lanes if tp not in placed]
                if unplaced and self._offset_reset == "earliest":
                    await consumer.seek_to_beginning(*unplaced)
                elif unplaced:
                    await consumer.seek_to_end(*unplaced)
                await self.memory.note_start(consumer, unplaced, self._offset_reset)
                consumer._fetcher._default_reset_strategy = OffsetResetStrategy.NONE
        except KafkaError as exc:
            raise self._error("reading where the stream starts", exc) from None
        await self.memory.start(self.cluster, consumer)  # a prompt answer: before the watchers' positions
        await self.positions.admit(consumer, self._rewind, self._seq, starting=True)
        self.anchors.unanchored |= set(lanes)
        log.info(
            "Kafka shared stream reading all %d partition(s) of %s (group %r, connection %r), %d watcher(s)",
            len(lanes),
            ",".join(self.topics),
            group_id,
            self.kafka_config_id,
            len(self.watchers.admitted()),
        )
        return consumer

    async def _off_the_log(
        self, consumer: AIOKafkaConsumer, exc: OffsetOutOfRangeError | NoOffsetForPartitionError
    ) -> None:
        """Place a lane whose position the log does not hold (:func:`.log_bounds.place_off_the_log`)."""
        if self._offset_reset == "none":
            raise self._error("reading from Kafka failed", exc) from None
        try:
            await place_off_the_log(self, consumer, exc)
        except KafkaError as error:
            raise self._error("reading where the partitions' logs start", error) from None

    async def _refresh_positions(self) -> None:
        """
        Commit the stream's and every live watcher's position again, unchanged, every interval.

        An idle stream commits nothing, and a broker expires a member-less group's offsets after
        ``offsets.retention.minutes``. Each watcher's position is read first, so a consumer of
        another shape on another triggerer is found within a round (:mod:`.marks`).
        """
        while True:
            await asyncio.sleep(POSITION_REFRESH_INTERVAL)
            self.committer.refresh()
            await self.positions.refresh()

    # -- advance --------------------------------------------------------------------------

    def get_advance_lane(self, broker_payload: KafkaBrokerPayload) -> Hashable:
        return broker_payload.topic, broker_payload.partition

    async def advance(self, batch: Sequence[AdvanceItem]) -> None:
        """
        Settle one partition's resolved prefix (see the module docstring).

        A batch of ACKs only is kept for the settler's next fold. Otherwise the kept ACKs are
        folded first, dead letters are produced and acknowledged by the broker here, before the
        commit that passes them is even queued, and the lane is folded.
        """
        self.credits.release(len(batch))  # every advanced message returns its credit, whatever happens
        if self.committer.error is not None:
            raise self.committer.error
        if self.renewed_at:  # an old log's dead letters are not sent (the settler checks again)
            batch = self.settler.of_current_logs(batch)
            if not batch:
                return
        # One decision per message, made here (the manager often advances one message at a time).
        plan = [decide(batch[0].outcome)] if len(batch) == 1 else [decide(item.outcome) for item in batch]
        if plan.count(Settlement.ACK) == len(plan):
            self.settler.keep_acks(batch)
            return
        self.settler.fold_acks()  # a lane's earlier ACKs are folded before this batch
        first: KafkaBrokerPayload = batch[0].broker_payload
        tp = TopicPartition(first.topic, first.partition)
        dead = [
            item.broker_payload
            for item, settlement in zip(batch, plan, strict=True)
            if settlement is Settlement.DEAD_LETTER
        ]
        if dead:
            with self.metrics.timed(m.ADVANCE_LATENCY):  # the one broker call an advance makes
                await self._dead_letter(dead)
        self.settler.fold(tp, batch, plan)

    def fold_advanced_acks(self) -> None:
        """Fold the ACKs kept for the committer's round (before each round and a watcher's leave)."""
        self.settler.fold_acks()

    async def _report_lag(self) -> None:
        """Broker lag and each watcher's, after a commit round (:mod:`.lag`)."""
        consumer = self._consumer
        if consumer is None:
            return
        stream_figures.set_lag(self.metrics, watcher_lag(consumer, self.watchers))
        self.metrics.gauge(m.BROKER_LAG, broker_lag(consumer, self.ledger))

    def _note_lag(self, consumer: AIOKafkaConsumer) -> None:
        """The watchers' lag after a fetch, at most once a second: idle watchers have no round."""
        now = time.monotonic()
        if now - self._lag_noted_at >= LAG_NOTE_INTERVAL:
            self._lag_noted_at = now
            stream_figures.set_lag(self.metrics, watcher_lag(consumer, self.watchers))

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
        await self.memory.aclose()  # after the last commits: a topic id they were first on is written
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
