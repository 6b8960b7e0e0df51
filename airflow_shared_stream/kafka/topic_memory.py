"""
Which topic ids a stream last committed positions on, kept outside Kafka.

Kafka deletes every group's committed offsets of a deleted topic (KAFKA-2000; Tansu too). A topic
deleted and created again while no stream of it runs therefore leaves the stream with no
position, as if it were new, and it starts at ``auto.offset.reset``: with ``latest`` everything
produced to the new topic meanwhile is skipped. Nothing Kafka keeps tells that from a position
that expired (``offsets.retention.minutes``), which by design starts at the read position
(docs/kafka.rst, "Idle streams"). The topic id the positions were committed on does.

So the stream keeps, per topic, the id it last committed positions on, in Airflow's asset state
store (the channel :mod:`~airflow_shared_stream.common.figures` uses): under
:func:`memory_key` (the stream's identity digest), in the asset of each of its watchers running
here (:func:`~airflow_shared_stream.common.figures.one_asset_writer`), at most
:data:`MAX_STORES` of them, lowest trigger id first; each write of a change raises its
``generation`` and a start takes the newest it reads (:meth:`TopicMemory._read`). It is
written, in the background, when the stream first commits on a topic id this memory does not
hold (its first start, a re-creation it followed), and once to each watcher's asset that does
not hold it yet (a watcher that joined later: a start with only such watchers would find no
memory).

At start it is read in the background (the store's reads go through the triggerer's supervisor and
can take tens of seconds), bounded by :data:`READ_TIMEOUT`; the stream anchors as it always did and
waits at most :data:`START_GRACE` for the answer before its first fetch. When it arrives:

* a topic whose id differs from the one remembered was created again while no stream ran: it is
  taken for created again exactly as a running stream takes it (:meth:`.ClusterWatch.suspect_new_log`,
  then :meth:`.ClusterWatch.follow` reads it from its start, for the stream and every watcher);
* the same id: the positions expired, or never were; nothing changes;
* a broker without topic ids (noida-db) cannot tell the two apart: a topic the stream had
  positions on and starts without any is named at WARNING with the offsets skipped.

It also keeps the new logs the stream saw (a topic created again, a partition added) that watchers
it served were away from (:attr:`.WatcherPositions.new_logs`): per lane, the new log's start, its
topic id and those watchers' position groups. Kafka deleted their positions with the old topic, and
a position of the old one still in flight may have landed on the new one, so without this a
watcher resuming after a restart could not be told from one with a position there, and would skip
the new log's first records. An entry is written with the new topic id, in one write (not before
the stream committed on that id); a watcher is dropped from it (written) once it has a position on
the new log. When the start's read answers within :data:`START_GRACE` the entries are given back
(:meth:`.WatcherPositions.recall`) before the watchers' positions are placed; a later answer puts
a watcher admitted meanwhile that an entry names back at the new log's start (duplicates, never a
skip). An entry of another topic id than the topic's (created again while no stream ran: every
watcher reads it from its start) is dropped. It keeps the position groups of the watchers the
stream served, too (at most :data:`MAX_SERVED`, the latest admitted): a watcher served only before
a restart, paused while the restarted stream saw a new log, is away from it like one the running
stream served.

Nothing here ever fails the stream: a read or write that fails or times out is logged, asked
again every 30 s, and the stream goes on as it would without the memory meanwhile.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from aiokafka import AIOKafkaConsumer, TopicPartition

if TYPE_CHECKING:
    from airflow_shared_stream.kafka.cluster_watch import ClusterWatch
    from airflow_shared_stream.kafka.watcher_positions import WatcherPositions
    from airflow_shared_stream.kafka.watchers import StreamWatchers

log = logging.getLogger(__name__)

MEMORY_KEY_PREFIX = "shared_stream.kafka.topic_ids"
READ_TIMEOUT = 120.0
"""Longest a start waits, in the background, for the memory (a loaded supervisor is slow)."""
WRITE_TIMEOUT = 60.0
READ_RETRY = 30.0
"""Seconds before a read of the memory that failed or timed out is asked again."""
WRITE_RETRY = 30.0
"""Seconds before a write of the memory that failed is asked again."""
START_GRACE = 1.0
"""Longest the first fetch waits for the memory: a prompt answer is applied before anything is read."""
MAX_STORES = 5
"""Most watchers' assets read (until one answers) and written."""
MAX_SERVED = 200
"""Most position groups of served watchers kept (the latest admitted): bounds the memory's size."""
CLOSE_WAIT = 5.0
"""Longest a stopping stream waits for a write in progress."""
STORE_POLL = 0.5


def memory_key(stream_id: str) -> str:
    """The state store key of a stream's memory (``stream_id``: the identity digest of figures)."""
    return f"{MEMORY_KEY_PREFIX}.{stream_id}"


NewLog = dict[str, Any]
"""One new log as the memory keeps it: ``topic``, ``partition``, ``start``, ``topic_id``, ``away``."""


class TopicMemory:
    """One producer's view of its stream's memory (see the module docstring)."""

    def __init__(
        self, watchers: StreamWatchers, topics: Sequence[str], positions: WatcherPositions | None = None
    ) -> None:
        self.watchers = watchers
        self.topics = list(topics)
        self.positions = positions
        if positions is not None:
            positions.on_new_logs = self._wake_up
            positions.on_served = self._note_served
        self.held: dict[str, str] | None = None
        """What the stores hold (read, then as written); ``None`` until the read is done."""
        self.held_new_logs: list[NewLog] = []
        """The new logs the stores hold (read, then as written)."""
        self.held_served: list[str] = []
        """The served watchers' groups the stores hold (read, then as written)."""
        self._served: dict[str, None] = {}
        """Groups served by this run and, read, by earlier runs: the latest admitted last."""
        self._cluster: ClusterWatch | None = None
        self._committed: dict[str, str] = {}
        self.unplaced: dict[TopicPartition, int] = {}
        """Lanes the stream found no position on at start, and where ``auto.offset.reset`` put them."""
        self.ready = asyncio.Event()
        self._wake = asyncio.Event()
        self._written = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._seen: dict[int, Any] = {}
        self._read_failures = 0
        self._generation = 0
        """The generation of the memory held: the newest read, raised by each write of a change."""
        self._given: set[int] = set()
        """Trigger ids whose asset's store holds :attr:`held` (a watcher that joined later is given it)."""

    # -- the producer's side ----------------------------------------------------------------

    async def note_start(
        self, consumer: AIOKafkaConsumer, unplaced: Sequence[TopicPartition], reset: str
    ) -> None:
        """Where the lanes without a position start (``auto.offset.reset``): what a skip would be."""
        if reset == "earliest":
            return  # nothing below the start: nothing skipped
        self.unplaced = {tp: await consumer.position(tp) for tp in unplaced}

    async def start(self, cluster: ClusterWatch, consumer: AIOKafkaConsumer) -> None:
        """Read the memory in the background; wait for it briefly if a watcher can give it."""
        if self._task is None:
            self._cluster = cluster
            self._task = asyncio.create_task(self._run(cluster, consumer), name="kafka-topic-memory")
        if self.watchers.carriers:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self.ready.wait(), START_GRACE)

    def _wake_up(self) -> None:
        self._wake.set()

    def _note_served(self, group: str) -> None:
        self._served.pop(group, None)
        self._served[group] = None
        if group not in self.held_served:
            self._wake.set()

    def committed_on(self, ids: dict[str, str]) -> None:
        """Positions were committed on these topic ids: remember them (written in the background)."""
        changed = False
        for topic, topic_id in ids.items():
            if self._committed.get(topic) != topic_id:
                self._committed[topic] = topic_id
                changed = True
        if changed:
            self._wake.set()

    async def aclose(self) -> None:
        task, self._task = self._task, None
        if task is None:
            return
        if self._due():  # a write is due: let it land
            self._wake.set()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(asyncio.shield(self._flushed()), CLOSE_WAIT)
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await task

    # -- the background task ------------------------------------------------------------------

    def _wanted(self) -> dict[str, str]:
        return {**(self.held or {}), **self._committed}

    def _new_logs_wanted(self) -> list[NewLog]:
        """The positions' new logs on the topic ids the memory keeps: written with the new id."""
        positions, cluster, wanted = self.positions, self._cluster, self._wanted()
        if positions is None or cluster is None:
            return []
        entries: list[NewLog] = []
        for tp, (start, away) in sorted(positions.new_logs.items()):
            shape = cluster.shapes.get(tp.topic)
            if shape is None or tp.topic in cluster.gone or wanted.get(tp.topic) != shape.topic_id:
                continue  # not committed on the new log yet: kept back until its id is written
            entries.append(_new_log(tp.topic, tp.partition, start, shape.topic_id, away))
        return entries

    def _served_wanted(self) -> list[str]:
        return list(self._served)[-MAX_SERVED:]

    def _value(self, topics: dict[str, str], new_logs: list[NewLog], served: list[str]) -> dict[str, Any]:
        value: dict[str, Any] = {"topics": topics}
        if self._generation:
            value["generation"] = self._generation
        if new_logs:
            value["new_logs"] = new_logs
        if served:
            value["served"] = served
        return value

    def _changed(self) -> bool:
        """Whether what the stores hold differs from what the stream would keep now."""
        return (
            self._wanted() != self.held
            or self._new_logs_wanted() != self.held_new_logs
            or set(self._served_wanted()) != set(self.held_served)
        )

    def _due(self) -> bool:
        """Whether a write is due: a new id or new log, or a watcher's asset without the memory yet."""
        if self.held is None:
            return False
        return self._changed() or bool(self.held and self._ungiven())

    def _ungiven(self) -> set[int]:
        return {trigger_id for trigger_id, _ in self._carried()} - self._given

    async def _flushed(self) -> None:
        while self._due():
            self._written.clear()
            await self._written.wait()

    async def _run(self, cluster: ClusterWatch, consumer: AIOKafkaConsumer) -> None:
        at_start = {topic: shape.topic_id for topic, shape in cluster.shapes.items()}
        try:
            while not self.watchers.carriers:  # noqa: ASYNC110 - watchers join from their own tasks
                await asyncio.sleep(STORE_POLL)
            stream_id, _ = next(iter(self.watchers.carriers.values()))
            key = memory_key(stream_id)  # read at once: the supervisor's API is ready (execution_api_warmup)
            remembered = await self._read(key)
            while remembered is None:  # asked again: a run that never read it could never write it,
                # and a re-creation it followed would then look to the next start like one while no
                # stream ran (the whole topic read again, for every watcher)
                self.ready.set()
                await asyncio.sleep(READ_RETRY)
                remembered = await self._read(key)
            ids, new_logs, served = remembered
            try:
                await self._apply(ids, cluster, consumer, at_start)
                self._recall_served(served)
                self._recall(ids, new_logs, cluster, at_start)
            except Exception as exc:  # never fails the stream
                log.warning("Comparing the stream's topics with its memory failed: %s", exc)
            self.held, self.held_new_logs, self.held_served = ids, new_logs, served
            self.ready.set()
            while True:
                # A write that failed is asked again: a memory left on the old id would make the
                # next start take the topic it read since for created again (read all again).
                # Every WRITE_RETRY also gives it to a watcher that joined since: memory kept only in
                # the first watchers' assets would be lost to a start with only later ones.
                waiter = asyncio.ensure_future(self._wake.wait())
                try:  # not wait_for: on 3.10/3.11 it can swallow a cancel that meets the wake
                    await asyncio.wait({waiter}, timeout=WRITE_RETRY)
                finally:
                    waiter.cancel()
                self._wake.clear()
                wanted, new_logs, served = self._wanted(), self._new_logs_wanted(), self._served_wanted()
                if self._changed():
                    self._generation += 1
                    written = await self._write(key, self._value(wanted, new_logs, served))
                    if written:
                        self.held, self.held_new_logs, self.held_served = wanted, new_logs, served
                        self._given = written
                elif self.held and (fresh := self._ungiven()):
                    held = self._value(self.held, self.held_new_logs, self.held_served)
                    self._given |= await self._write(key, held, fresh)
                self._written.set()
        finally:
            self.ready.set()

    def _carried(self) -> list[tuple[int, Any]]:
        """The watchers' stores, lowest trigger id first; one that left is kept (a stream that stops)."""
        self._seen.update((trigger_id, store) for trigger_id, (_, store) in self.watchers.carriers.items())
        return sorted(self._seen.items(), key=lambda item: item[0])[:MAX_STORES]

    async def _read(self, key: str) -> tuple[dict[str, str], list[NewLog], list[str]] | None:
        """
        The newest memory the watchers' assets hold (topic ids, new logs, served): the highest
        ``generation``, the lowest trigger id among equals. An asset of a watcher that was paused
        while another run of the stream wrote the memory holds an older one (a stale topic id
        would make this start read a topic it followed again). Empty when none holds one;
        ``None`` when one does not answer in time (this run then writes nothing: a memory it did
        not read is not overwritten).
        """
        loop = asyncio.get_running_loop()
        deadline = loop.time() + READ_TIMEOUT
        newest: tuple[int, int, dict[str, Any]] | None = None
        for trigger_id, store in self._carried():
            try:
                value = await asyncio.wait_for(store.aget(key), max(deadline - loop.time(), 0.01))
            except Exception as exc:
                self._read_failures += 1  # said once at WARNING; asked again every READ_RETRY
                log.log(
                    logging.WARNING if self._read_failures == 1 else logging.INFO,
                    "Reading which Kafka topic ids stream %s last committed on failed (%s): a topic "
                    "deleted and created again while no stream ran is detected only once a read "
                    "answers (asked again)",
                    ",".join(self.topics),
                    type(exc).__name__,
                )
                return None
            if isinstance(value, dict) and isinstance(value.get("topics"), dict):
                generation = value.get("generation")
                generation = generation if isinstance(generation, int) else 0
                if newest is None or generation > newest[0]:
                    newest = (generation, trigger_id, value)
        if newest is None:
            return {}, [], []
        self._generation, chosen, value = newest
        self._given = {chosen}  # the others are given it (written) as watchers that joined later
        # An id that is not text (a value someone else wrote) is left out: read as "None", it
        # would differ from every topic's id and take the topic for created again (read all again).
        ids = {
            str(topic): topic_id for topic, topic_id in value["topics"].items() if isinstance(topic_id, str)
        }
        served = value.get("served")
        groups = [str(group) for group in served] if isinstance(served, list) else []
        return ids, _read_new_logs(value.get("new_logs")), groups[-MAX_SERVED:]

    async def _write(self, key: str, value: dict[str, Any], only: set[int] | None = None) -> set[int]:
        """Write ``value`` to the watchers' stores (``only`` these trigger ids); those written."""
        wrote: set[int] = set()
        for trigger_id, store in self._carried():
            if only is not None and trigger_id not in only:
                continue
            try:
                await asyncio.wait_for(store.aset(key, value), WRITE_TIMEOUT)
                wrote.add(trigger_id)
            except Exception as exc:
                log.info("Writing which Kafka topic ids the stream committed on failed: %s", exc)
        return wrote

    def _recall_served(self, served: list[str]) -> None:
        """
        The watchers earlier runs served are the stream's served ones too: away from a new log it
        sees while they are paused. One this run never admitted is away from the new logs this
        run saw before the answer came (it came late) too.
        """
        positions = self.positions
        if positions is None:
            return
        self._served = {**dict.fromkeys(served), **self._served}
        never_here = set(served) - positions.served
        positions.served |= never_here
        for tp, (start, away) in list(positions.new_logs.items()):  # only this run's: before recall
            positions.new_logs[tp] = (start, away | never_here)

    def _recall(
        self,
        remembered: dict[str, str],
        new_logs: list[NewLog],
        cluster: ClusterWatch,
        at_start: dict[str, str],
    ) -> None:
        """Give the new logs an earlier run saw back to the positions (module docstring)."""
        if self.positions is None:
            return
        for entry in new_logs:
            topic = entry["topic"]
            shape = cluster.shapes.get(topic)
            if shape is None or topic in cluster.gone or topic not in self.topics:
                continue
            if at_start.get(topic, shape.topic_id) != shape.topic_id:
                continue  # created again since this start: followed, every watcher reads it from its start
            if entry["topic_id"] != shape.topic_id or remembered.get(topic) != shape.topic_id:
                continue  # created again while no stream ran: every watcher reads it from its start
            lane = TopicPartition(topic, entry["partition"])
            self.positions.recall(lane, entry["start"], frozenset(entry["away"]))

    async def _apply(
        self,
        remembered: dict[str, str],
        cluster: ClusterWatch,
        consumer: AIOKafkaConsumer,
        at_start: dict[str, str] | None = None,
    ) -> None:
        """Compare what the stream last committed on with the topics it found (module docstring)."""
        for topic in self.topics:
            before = remembered.get(topic)
            shape = cluster.shapes.get(topic)
            current = shape.topic_id if shape is not None else ""  # None: no Metadata v10
            if before is None or topic in cluster.gone:
                continue  # never committed on it, or it is gone (the cluster check says so)
            if at_start is not None and at_start.get(topic, current) != current:
                continue  # created again since this start: followed (read from its start) already
            if before and current:
                if before != current:
                    log.warning(
                        "Kafka topic %s is not the log this stream last committed positions on (topic "
                        "id %s then, %s now): it was deleted and created again while no stream ran, "
                        "and Kafka deleted its positions with it",
                        topic,
                        before,
                        current,
                    )
                    self._committed.pop(topic, None)  # noted before this: of the new log's end
                    cluster.suspect_new_log(topic)
                continue
            lanes = sorted(tp for tp in self.unplaced if tp.topic == topic)
            if not lanes or current:
                continue  # with ids, the same id: the positions expired (docs/kafka.rst, "Idle streams")
            starts = await consumer.beginning_offsets(lanes)
            skipped = [
                f"{tp.partition}: {starts[tp]}-{self.unplaced[tp] - 1}"
                for tp in lanes
                if tp in starts and self.unplaced[tp] > starts[tp]
            ]
            if skipped:
                log.warning(
                    "Kafka topic %s: this stream had positions on it and starts with none; offsets "
                    "%s were not read (skipped: auto.offset.reset). Either the topic was deleted "
                    "and created again while no stream ran (Kafka deletes its positions with it), or "
                    "the positions expired (offsets.retention.minutes): a broker without topic ids "
                    "cannot tell which",
                    topic,
                    ", ".join(skipped),
                )


def _new_log(topic: str, partition: int, start: int, topic_id: str, away: frozenset[str]) -> NewLog:
    away_groups = sorted(away)
    return {"topic": topic, "partition": partition, "start": start, "topic_id": topic_id, "away": away_groups}


def _read_new_logs(value: Any) -> list[NewLog]:
    """The new logs of a memory read, in the form it is written; what does not parse is left out."""
    entries: list[NewLog] = []
    for item in value if isinstance(value, list) else ():
        try:
            entries.append(
                _new_log(
                    str(item["topic"]),
                    int(item["partition"]),
                    int(item["start"]),
                    str(item["topic_id"]),
                    frozenset(str(group) for group in item["away"]),
                )
            )
        except (KeyError, TypeError, ValueError):
            continue
    return sorted(entries, key=lambda entry: (entry["topic"], entry["partition"]))
