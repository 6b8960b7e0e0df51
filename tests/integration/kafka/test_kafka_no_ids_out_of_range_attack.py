"""
Attack on issue 46's re-creation detection without topic ids (FAULT_MODEL classes 14 and 16).

On a broker without topic ids (Apache Kafka before 2.8, noida-db) the stream takes a topic for
created again when a fetch is answered "offset out of range" past the log's end (docs/kafka.rst,
"A topic deleted and created again"). Kafka answers such a fetch at once, but the stream reads the
log's bounds (ListOffsets) only afterwards, in another request: a producer writing to the new topic
meanwhile (a busy producer writes as soon as the topic exists again) moves its end past the old
position. The fetch's answer already said the log ended below the position.

Found while bringing back the test shim that holds noida-db's empty fetches as Kafka does
(``git show 83a0374:tests/support/kafka_fetch_wait.py``): with it, five noida-db re-creation tests
lost records this way (``position 5 is not in the log 0-15: reading from 0``). noida-db's instant
empty fetches made the stream's out-of-range answer come before the test produced; here the window
is held open, so it happens every time, on either broker timing.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

import pytest

from airflow_shared_stream.kafka import cluster_watch, log_bounds
from airflow_shared_stream.kafka.trigger import KafkaSharedStreamTrigger
from airflow_shared_stream.kafka.watchers import watcher_group_id
from airflow_shared_stream.testing import SharedStreamHarness
from tests.integration.kafka.test_kafka_cluster_changes import _until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

POSITIONS_LOG = "airflow_shared_stream.kafka"


def _round(handle: Any, n: int) -> list[int]:
    return [p["value"]["i"] for p in handle.payloads if p["value"].get("round") == n]


@pytest.mark.parametrize("reset", ["earliest", "latest"])
@pytest.mark.parametrize("kafka_broker", ["noida-db"], indirect=True)  # a broker without topic ids
async def test_a_new_log_filled_between_the_out_of_range_fetch_and_the_bounds_read_is_read_from_its_start(
    kafka, monkeypatch, caplog, reset
):
    """
    Class 14 / 16. The stream read records 0-9 (position 10). The topic is deleted and created
    again (empty); the stream's next fetch at 10 is answered "offset out of range". Before the
    stream reads the log's bounds, a producer writes 15 records to the new topic (0-14). The
    bounds then say 0-15, which holds 10, and the stream took the answer for an ordinary reset:
    ``auto.offset.reset`` (INFO ``position 10 is not in the log 0-15``), no new log. With
    ``latest`` the stream and the watcher skipped all 15; with ``earliest`` the stream read from
    0 but the watcher, its position still 10 of the old log, skipped 0-9. The cluster check
    never sees it afterwards (no id, the topic was never seen missing, the end is above the
    position). The answer itself said the log ended below 10: a new log, read from its start.
    """
    caplog.set_level(logging.INFO, logger=POSITIONS_LOG)
    monkeypatch.setattr(cluster_watch, "CLUSTER_CHECK_INTERVAL", 0.2)
    checking = asyncio.Event()
    checking.set()
    due = cluster_watch.ClusterWatch.due
    monkeypatch.setattr(cluster_watch.ClusterWatch, "due", lambda watch: checking.is_set() and due(watch))
    out_of_range, filled = asyncio.Event(), asyncio.Event()
    read_bounds = log_bounds.read_log_bounds

    async def bounds_read_after_the_producer(consumer: Any, lanes: Any) -> Any:
        # Only the out-of-range path calls this module-level name now (the stream has started).
        out_of_range.set()
        await filled.wait()
        return await read_bounds(consumer, lanes)

    topic, group = kafka.name("t"), kafka.name("g")
    await kafka.create_topics(topic)
    trigger = KafkaSharedStreamTrigger(
        [topic], kafka_config_id=kafka.connection(reset, **{"auto.offset.reset": reset}), group_id=group
    )
    own_group = watcher_group_id(group, trigger.watcher_digest())
    async with SharedStreamHarness(confirm_after=0.0) as triggerer:
        w = triggerer.add(trigger)
        assert await kafka.wait_committed(own_group, topic, {0: 0}) == {0: 0}
        await kafka.produce(topic, [{"round": 1, "i": i} for i in range(10)])
        await w.wait_for_events(10)
        assert await kafka.wait_committed(own_group, topic, {0: 10}) == {0: 10}
        checking.clear()  # the periodic check does not see the topic missing (it is quick)
        monkeypatch.setattr(log_bounds, "read_log_bounds", bounds_read_after_the_producer)
        await kafka.delete_topic(topic, groups=(group, own_group))
        await kafka.create_topics(topic)
        await asyncio.wait_for(out_of_range.wait(), 30)  # the fetch at 10 on the empty new log
        await kafka.produce(topic, [{"round": 2, "i": i} for i in range(15)])
        filled.set()
        checking.set()
        await kafka.produce(topic, [{"round": 2, "i": 15}])
        with contextlib.suppress(AssertionError):
            await _until(lambda: set(_round(w, 2)) >= set(range(16)), "0-15 of the new log", timeout=20)
        assert set(_round(w, 2)) >= set(range(16)), f"the new log skipped: {_round(w, 2)}"
        assert await kafka.wait_committed(own_group, topic, {0: 16}) == {0: 16}
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("is a new log" in m for m in warnings), warnings
