"""
Attacks on the re-creation fix (issue 46) and its dropped commits, on real brokers (FAULT_MODEL
classes 3, 7, 10, 11, 14).
"""

from __future__ import annotations

import contextlib
import logging

import pytest

from airflow_shared_stream.kafka import cluster_watch
from airflow_shared_stream.kafka.trigger import KafkaSharedStreamTrigger
from airflow_shared_stream.kafka.watchers import watcher_group_id
from airflow_shared_stream.testing import SharedStreamHarness
from tests.integration.kafka.test_kafka_cluster_changes import _until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


def _round(handle, n: int) -> list[int]:
    return [p["value"]["i"] for p in handle.payloads if p["value"].get("round") == n]


@pytest.mark.xfail(
    strict=True,
    reason="aiokafka's consumer.commit retries UNKNOWN_TOPIC_OR_PARTITION for ever: the stream's "
    "committer round never ends, so no position of any watcher or of the stream moves again",
)
@pytest.mark.parametrize("kafka_broker", ["tansu"], indirect=True)
async def test_a_topic_deleted_for_good_does_not_stall_the_streams_commits_of_its_other_topic(
    kafka, monkeypatch, caplog
):
    """
    Class 14 / 7: one stream reads two topics; one of them is deleted for good. The stream's
    own position refresh queues that topic's lane again, and its commit is refused
    ``UNKNOWN_TOPIC_OR_PARTITION``. The other topic's records go on firing, and the stream's
    commit of them must go on too (a restart re-fires only what is not committed).

    Broke: the stream commits through ``AIOKafkaConsumer.commit``, which takes
    ``UNKNOWN_TOPIC_OR_PARTITION`` for retriable and asks again every 100 ms for ever (an ERROR
    line each time). The committer's round never ends, so the kept ACKs are never folded: the
    watcher's own position and the stream's commit stay at 3 while the kept topic's records fire
    (every restart re-fires all of them, for as long as the stream runs). Kafka answers that code
    for a topic it does not have (``KafkaApis.handleOffsetCommitRequest``); Tansu does too.
    Tansu only: noida-db creates the deleted topic again on the stream's next metadata request
    (auto-creation), so a topic is never gone for good there.
    """
    from airflow_shared_stream.kafka import producer as producer_module

    caplog.set_level(logging.INFO)
    monkeypatch.setattr(cluster_watch, "CLUSTER_CHECK_INTERVAL", 0.2)
    monkeypatch.setattr(producer_module, "POSITION_REFRESH_INTERVAL", 0.2)
    kept, dropped, group = kafka.name("kept"), kafka.name("dropped"), kafka.name("g")
    await kafka.create_topics(kept, dropped)
    trigger = KafkaSharedStreamTrigger([kept, dropped], kafka_config_id=kafka.conn_id, group_id=group)
    own_group = watcher_group_id(group, trigger.watcher_digest())
    async with SharedStreamHarness(confirm_after=0.0) as triggerer:
        w = triggerer.add(trigger)
        assert await kafka.wait_committed(own_group, kept, {0: 0}) == {0: 0}
        await kafka.produce(kept, [{"round": 1, "i": i} for i in range(3)])
        await kafka.produce(dropped, [{"round": 1, "i": i} for i in range(3)])
        await w.wait_for_events(6)
        assert await kafka.wait_committed(group, kept, {0: 3}) == {0: 3}
        await kafka.delete_topic(dropped, groups=())
        # Let several refreshes of the gone topic's lane come and go.
        await _until(
            lambda: sum("UnknownTopicOrPartition" in r.getMessage() or "the topic is gone" in r.getMessage()
                        for r in caplog.records) >= 3,
            "commits refused for the gone topic",
        )
        await kafka.produce(kept, [{"round": 2, "i": i} for i in range(4)])
        with contextlib.suppress(AssertionError):
            await _until(lambda: set(_round(w, 2)) >= set(range(4)), "round 2 of the kept topic")
        assert set(_round(w, 2)) == set(range(4)), _round(w, 2)
        assert await kafka.wait_committed(own_group, kept, {0: 7}) == {0: 7}
        assert await kafka.wait_committed(group, kept, {0: 7}) == {0: 7}, "the stream's commit stalled"
        assert w.error is None, w.error
    spins = [r for r in caplog.records if r.levelno >= logging.ERROR and "UnknownTopicOrPartition" in r.getMessage()]
    assert len(spins) < 5, f"{len(spins)} ERROR lines for one gone topic: {spins[-1].getMessage()}"
