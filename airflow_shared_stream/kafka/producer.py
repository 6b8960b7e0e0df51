"""
The broker half of a Kafka shared stream: one aiokafka consumer, settled per partition.

One :class:`KafkaSharedStreamProducer` owns the consumer of one shared-stream group in the
triggerer. It fetches in batches (``getmany``) sized by the credit window, so no more than
``max_in_flight`` messages are ever yielded and unsettled, and subscriber queues cannot
overflow. Each message is its own raw event; its lane is its ``(topic, partition)``, so a slow
partition holds back only its own commits.

Settlement (see :mod:`airflow_shared_stream.common.settlement`):

* ACK: commit the highest offset of the lane below which everything is settled (cumulative).
  A background task sends the commit points of all partitions in one request, at most every
  ``COMMIT_INTERVAL``: a commit that has not reached the broker yet only means redelivery.
* DEAD_LETTER: produce the record (key, value, headers, plus origin headers) to
  ``dead_letter_topic`` and wait for the broker's acknowledgement, then commit past it. Without a
  dead-letter topic the record is logged and committed past, as Airflow's own producer does.
* REDELIVER: hold the offset as the lane's floor (nothing is committed at or past it) and seek
  the consumer back to it; see :mod:`airflow_shared_stream.kafka.offsets`.

Rebalances: aiokafka calls the listener before partitions are taken away. Messages of a revoked
partition still in flight are left to its next owner (it reads from the last commit, so they are
redelivered there); their later advance is ignored, so this consumer never commits or seeks a
partition it no longer owns and a rebalance never fails the group.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import logging
import time
from collections.abc import AsyncIterator, Hashable, Sequence
from typing import Any, NamedTuple

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, ConsumerRebalanceListener, TopicPartition
from aiokafka.errors import CommitFailedError, IllegalStateError, KafkaError, RebalanceInProgressError
from airflow.triggers.shared_stream import AdvanceItem, SharedStreamProducer

from airflow_shared_stream.common.flow_control import CreditWindow, yield_point
from airflow_shared_stream.common.matching import RawMessage, decode_body
from airflow_shared_stream.common.settlement import Settlement, decide, describe_batch
from airflow_shared_stream.common.trigger import DEFAULT_MAX_IN_FLIGHT, DEFAULT_MAX_PAYLOAD_BYTES
from airflow_shared_stream.kafka.hook import KafkaClientConfig, KafkaHook
from airflow_shared_stream.kafka.offsets import OffsetLedger

log = logging.getLogger(__name__)

POLL_TIMEOUT_MS = 500
"""How long one ``getmany`` waits for records; bounds how late a stop is noticed."""

COMMIT_INTERVAL = 0.2
"""Least time between two commit requests; targets settled meanwhile go in the next one."""

ZERO_SUBSCRIBER_BACKOFF = 0.25
"""Pause before re-reading a message no subscriber was online for, instead of spinning on it."""

ORIGIN_HEADERS = ("x-shared-stream-topic", "x-shared-stream-partition", "x-shared-stream-offset")


class KafkaSharedStreamError(RuntimeError):
    """A Kafka shared stream cannot run. The message names the cause and never a secret."""


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
    key: bytes | None = None
    value: bytes | None = None
    headers: tuple[tuple[str, bytes], ...] = ()


class _Credits(CreditWindow):
    """The credit window, plus a synchronous spend for credits known to be free."""

    def take(self) -> None:
        """Spend a credit known to be free (the fetch was sized by the free credits)."""
        self._in_flight += 1


def default_group_id(key: Hashable) -> str:
    """A stable consumer group id for a trigger that names none: derived from its stream key."""
    digest = hashlib.sha256(repr(key).encode()).hexdigest()[:20]
    return f"airflow-shared-stream-{digest}"


def _text(data: bytes | None) -> str | None:
    """Header values and keys as text where they are UTF-8, else base64 (still JSON-able)."""
    if data is None:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return "base64:" + base64.b64encode(data).decode("ascii")


def build_raw_message(record: Any, max_payload_bytes: int) -> RawMessage:
    """Turn one aiokafka ``ConsumerRecord`` into the envelope every subscriber matches against."""
    label = f"{record.topic}/{record.partition}@{record.offset}"
    envelope: dict[str, Any] = {
        "topic": record.topic,
        "partition": record.partition,
        "offset": record.offset,
        "timestamp": record.timestamp,
        "key": _text(record.key),
        "value": None,
        "headers": {name: _text(value) for name, value in record.headers} if record.headers else {},
    }
    size = len(record.value) if record.value is not None else 0
    if size > max_payload_bytes:
        reason = f"value is {size} bytes, over the {max_payload_bytes}-byte payload limit"
        return RawMessage(envelope, label=label, unprocessable=reason)
    value, error = decode_body(record.value)
    envelope["value"] = value
    return RawMessage(envelope, label=label, unprocessable=error)


class _RebalanceListener(ConsumerRebalanceListener):
    def __init__(self, producer: KafkaSharedStreamProducer) -> None:
        self._producer = producer

    async def on_partitions_revoked(self, revoked: Any) -> None:
        await self._producer._on_revoked(revoked)

    async def on_partitions_assigned(self, assigned: Any) -> None:
        self._producer._on_assigned(assigned)


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
        group_id: str,
        kafka_conn_id: str = "kafka_default",
        group_id_is_default: bool = False,
        dead_letter_topic: str | None = None,
        max_in_flight: int = DEFAULT_MAX_IN_FLIGHT,
        max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES,
        poll_timeout_ms: int = POLL_TIMEOUT_MS,
    ) -> None:
        self.topics = list(topics)
        self.kafka_conn_id = kafka_conn_id
        self.group_id = group_id
        # A derived id yields to the connection's group.id; an explicit one wins over it.
        self._group_id_is_default = group_id_is_default
        self.dead_letter_topic = dead_letter_topic
        self.max_payload_bytes = max_payload_bytes
        self.poll_timeout_ms = poll_timeout_ms
        self._credits = _Credits(max_in_flight)
        self._ledger = OffsetLedger()
        self._consumer: AIOKafkaConsumer | None = None
        self._dlq: AIOKafkaProducer | None = None
        self._config: KafkaClientConfig | None = None
        # Per partition: bumped on every revoke (payloads read before it belong to whoever owns
        # the partition next; records fetched since belong to the new assignment, which aiokafka
        # can hand out before the listener hears of it) and on every seek or revoke for fetches
        # (records fetched before are stale).
        self._assignment_epoch: dict[TopicPartition, int] = {}
        self._fetch_epoch: dict[TopicPartition, int] = {}
        self._paused_until = 0.0
        # Commit targets not yet sent, per partition with the assignment epoch they belong to.
        self._pending_commits: dict[TopicPartition, tuple[int, int]] = {}
        self._commit_wakeup = asyncio.Event()
        self._committer: asyncio.Task[None] | None = None
        self._commit_error: KafkaSharedStreamError | None = None

    # -- stream ---------------------------------------------------------------------------

    async def open_stream(self) -> AsyncIterator[tuple[RawMessage, KafkaBrokerPayload]]:
        consumer = await self._connect()
        self._committer = asyncio.create_task(self._commit_loop(), name="kafka-shared-stream-committer")
        keep_record = self.dead_letter_topic is not None
        while True:
            if self._commit_error is not None:
                raise self._commit_error
            available = await self._credits.wait_for_credit()
            delay = self._paused_until - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            try:
                fetched = await consumer.getmany(timeout_ms=self.poll_timeout_ms, max_records=available)
            except KafkaError as exc:
                raise self._error("reading from Kafka failed", exc) from None
            for tp, records in fetched.items():
                fetch_epoch = self._fetch_epoch.get(tp, 0)
                epoch = self._assignment_epoch.get(tp, 0)
                for record in records:
                    if self._fetch_epoch.get(tp, 0) != fetch_epoch:
                        break  # sought back or revoked meanwhile: the rest is stale
                    if keep_record:
                        payload = KafkaBrokerPayload(
                            record.topic,
                            record.partition,
                            record.offset,
                            epoch,
                            record.key,
                            record.value,
                            tuple(record.headers or ()),
                        )
                    else:
                        payload = KafkaBrokerPayload(record.topic, record.partition, record.offset, epoch)
                    self._credits.take()
                    yield build_raw_message(record, self.max_payload_bytes), payload
                    # Let the subscribers take each message before the next one. Measured with
                    # the real manager: yielding a whole fetch in one burst is slower (the
                    # manager's per-event work does not batch), although the window alone
                    # already rules out a queue overflow.
                    await yield_point()

    async def _connect(self) -> AIOKafkaConsumer:
        config = await KafkaHook(self.kafka_conn_id).aget_client_config()
        self._config = config
        group_id = config.group_id if self._group_id_is_default and config.group_id else self.group_id
        servers = ",".join(config.common["bootstrap_servers"])
        consumer = AIOKafkaConsumer(**config.consumer_kwargs(group_id))
        self._consumer = consumer
        try:
            await consumer.start()
        except Exception as exc:
            raise self._error(f"cannot connect to Kafka at {servers}", exc) from None
        try:
            existing = await consumer.topics()
        except KafkaError as exc:
            raise self._error(f"cannot read topic metadata from {servers}", exc) from None
        missing = sorted(set(self.topics) - set(existing))
        if missing:
            raise KafkaSharedStreamError(
                f"Kafka topic(s) {', '.join(missing)} do not exist on {servers} "
                f"(connection {self.kafka_conn_id!r}); create them first"
            )
        if self.dead_letter_topic is not None:
            if self.dead_letter_topic not in existing:
                raise KafkaSharedStreamError(
                    f"dead-letter topic {self.dead_letter_topic!r} does not exist on {servers}"
                )
            self._dlq = AIOKafkaProducer(**config.producer_kwargs())
            try:
                await self._dlq.start()
            except Exception as exc:
                raise self._error(f"cannot start the dead-letter producer for {servers}", exc) from None
        consumer.subscribe(self.topics, listener=_RebalanceListener(self))
        log.info(
            "Kafka shared stream consuming %s as group %r (connection %r)",
            ",".join(self.topics),
            group_id,
            self.kafka_conn_id,
        )
        return consumer

    def _error(self, what: str, exc: BaseException) -> KafkaSharedStreamError:
        """Wrap a client error with context, scrubbed of any secret of the connection."""
        detail = f"{type(exc).__name__}: {exc}"
        for secret in self._config.secrets if self._config else ():
            detail = detail.replace(secret, "***")
        return KafkaSharedStreamError(f"{what} (connection {self.kafka_conn_id!r}): {detail}")

    # -- rebalance ------------------------------------------------------------------------

    async def _on_revoked(self, revoked: Any) -> None:
        # Commit what is settled while the partitions are still ours: fewer redeliveries.
        try:
            await self._flush_commits(only=set(revoked))
        except Exception as exc:  # never let a listener error break the rebalance
            log.warning("Commit before revoke failed: %s", type(exc).__name__)
        for tp in revoked:
            self._assignment_epoch[tp] = self._assignment_epoch.get(tp, 0) + 1
            self._fetch_epoch[tp] = self._fetch_epoch.get(tp, 0) + 1
            self._ledger.forget((tp.topic, tp.partition))
        if revoked:
            log.info(
                "Kafka partitions revoked: %s", ", ".join(f"{tp.topic}/{tp.partition}" for tp in revoked)
            )

    def _on_assigned(self, assigned: Any) -> None:
        if assigned:
            log.info(
                "Kafka partitions assigned: %s", ", ".join(f"{tp.topic}/{tp.partition}" for tp in assigned)
            )

    def _owns(self, tp: TopicPartition, epoch: int) -> bool:
        """Read since the partition's last revoke, and still assigned (aiokafka's live view)."""
        consumer = self._consumer
        return (
            self._assignment_epoch.get(tp, 0) == epoch
            and consumer is not None
            and tp in consumer.assignment()
        )

    # -- advance --------------------------------------------------------------------------

    def get_advance_lane(self, broker_payload: KafkaBrokerPayload) -> Hashable:
        return broker_payload.topic, broker_payload.partition

    async def advance(self, batch: Sequence[AdvanceItem]) -> None:
        """
        Settle one partition's resolved prefix (see the module docstring).

        Dead letters are produced and acknowledged by the broker here, before the commit that
        passes them is even queued. The commit itself is sent by the committer task, which
        coalesces the targets of every partition into one request per round trip: awaiting a
        commit per advance would cap the stream at one round trip per message, because the
        manager awaits one advance at a time. A commit that has not reached the broker when the
        triggerer dies only means redelivery, which at-least-once allows.
        """
        # Every advanced message returns its credit, whatever happens below.
        self._credits.release(len(batch))
        if self._commit_error is not None:
            raise self._commit_error
        first: KafkaBrokerPayload = batch[0].broker_payload
        tp = TopicPartition(first.topic, first.partition)
        epoch = self._assignment_epoch.get(tp, 0)
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
                return
        if not self._owns(tp, epoch):
            log.info(
                "Not settling %d message(s) of %s/%d: the partition is not assigned here now",
                len(batch),
                first.topic,
                first.partition,
            )
            return
        items: list[tuple[int, Settlement]] = []
        dead: list[KafkaBrokerPayload] = []
        for item in batch:
            settlement = decide(item.outcome)
            if settlement is Settlement.DEAD_LETTER:
                dead.append(item.broker_payload)
            elif item.outcome.acked == item.outcome.failed == item.outcome.rejected == 0:
                # Nobody was subscribed: do not spin re-reading it until somebody is.
                self._paused_until = time.monotonic() + ZERO_SUBSCRIBER_BACKOFF
            items.append((item.broker_payload.offset, settlement))
        if dead:
            await self._dead_letter(dead)
        action = self._ledger.settle((tp.topic, tp.partition), items)
        if log.isEnabledFor(logging.DEBUG):
            log.debug("Kafka advance %s/%d %s -> %s", tp.topic, tp.partition, describe_batch(batch), action)
        if action.commit is not None:
            self._pending_commits[tp] = (action.commit, epoch)
            self._commit_wakeup.set()
        if action.seek is not None and self._consumer is not None and self._owns(tp, epoch):
            self._fetch_epoch[tp] = self._fetch_epoch.get(tp, 0) + 1
            self._consumer.seek(tp, action.seek)
            log.info("Redelivering %s/%d from offset %d", tp.topic, tp.partition, action.seek)

    async def _commit_loop(self) -> None:
        while True:
            await self._commit_wakeup.wait()
            self._commit_wakeup.clear()
            try:
                await self._flush_commits()
            except Exception as exc:  # surfaced by the next advance or fetch, which fail the group
                self._commit_error = self._error("committing offsets failed", exc)
                return
            # Coalesce: under load every message settles on its own, and a commit request per
            # message costs the broker and this loop more than the whole fan-out does.
            await asyncio.sleep(COMMIT_INTERVAL)

    async def _flush_commits(self, only: set[TopicPartition] | None = None) -> None:
        """Send the pending commit targets (of ``only`` these partitions) in one request."""
        chosen = [tp for tp in self._pending_commits if only is None or tp in only]
        pending = {tp: self._pending_commits.pop(tp) for tp in chosen}
        offsets = {tp: offset for tp, (offset, epoch) in pending.items() if self._owns(tp, epoch)}
        consumer = self._consumer
        if not offsets or consumer is None:
            return
        try:
            await consumer.commit(offsets)
        except (CommitFailedError, IllegalStateError, RebalanceInProgressError) as exc:
            # Lost to a rebalance: the partitions' next owner reads from the previous commit,
            # so the messages are redelivered, never lost. Not a reason to fail the group.
            log.info("Commit dropped by a rebalance (%s); the next owner redelivers", type(exc).__name__)
        except KafkaError as exc:
            self._commit_error = self._error("committing offsets failed", exc)
            log.error("%s", self._commit_error)

    async def _dead_letter(self, payloads: list[KafkaBrokerPayload]) -> None:
        if self.dead_letter_topic is None or self._dlq is None:
            for payload in payloads:
                log.warning(
                    "Dropping rejected message %s/%d@%d: no dead_letter_topic configured",
                    payload.topic,
                    payload.partition,
                    payload.offset,
                )
            return
        try:
            deliveries = []
            for payload in payloads:
                origin = (str(payload.topic), str(payload.partition), str(payload.offset))
                headers = [
                    *payload.headers,
                    *((n, v.encode()) for n, v in zip(ORIGIN_HEADERS, origin, strict=True)),
                ]
                deliveries.append(
                    await self._dlq.send(
                        self.dead_letter_topic, value=payload.value, key=payload.key, headers=headers
                    )
                )
            await self._dlq.flush()
            await asyncio.gather(*deliveries)
        except KafkaError as exc:
            raise self._error(
                f"producing to dead-letter topic {self.dead_letter_topic!r} failed", exc
            ) from None
        log.warning("Dead-lettered %d message(s) to %s", len(payloads), self.dead_letter_topic)

    async def aclose(self) -> None:
        committer, self._committer = self._committer, None
        if committer is not None:
            committer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await committer
            try:
                await asyncio.wait_for(self._flush_commits(), 10)
            except Exception as exc:
                log.warning(
                    "Final commit failed (%s); those messages will be redelivered", type(exc).__name__
                )
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
