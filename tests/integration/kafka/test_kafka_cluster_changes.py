"""
Positions when the cluster changes under a stream (FAULT_MODEL class 14), against real brokers.

Retention deleting past a position, a coordinator that is loading, a topic deleted and created
again, partitions added while the stream runs: each is "never a silent skip; read from the start
of what is new, or say loudly what was lost". Each :class:`SharedStreamHarness` is one triggerer.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any

import pytest
from aiokafka import TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewPartitions, NewTopic, RecordsToDelete

from airflow_shared_stream.kafka import producer as producer_module
from airflow_shared_stream.kafka.trigger import KafkaSharedStreamTrigger
from airflow_shared_stream.kafka.watchers import watcher_group_id
from airflow_shared_stream.testing import SharedStreamHarness, Watcher
from tests.support.kafka_proxy import KafkaProtocolProxy

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

LATEST = {"auto.offset.reset": "latest"}
POSITIONS_LOG = "airflow_shared_stream.kafka"


async def _admin(kafka: Any, act: Callable[[AIOKafkaAdminClient], Any]) -> Any:
    admin = AIOKafkaAdminClient(bootstrap_servers=kafka.bootstrap)
    await admin.start()
    try:
        return await act(admin)
    finally:
        await admin.close()


async def _until(condition: Callable[[], bool], what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out after {timeout}s waiting for {what}"
        await asyncio.sleep(0.05)


async def _received_up_to(watcher: Watcher, last: Any, key: str = "i") -> list[Any]:
    """What ``watcher`` received, once the record whose ``key`` is ``last`` came (the marker)."""
    await _until(lambda: any(p["value"][key] == last for p in watcher.payloads), f"{key}={last}")
    return [p["value"][key] for p in watcher.payloads]


# -- 5: retention deletes past a position ------------------------------------------------------


@pytest.mark.parametrize("kafka_broker", ["noida-db"], indirect=True)  # Tansu: no DeleteRecords
async def test_a_position_below_the_log_start_moves_to_it_loudly_and_restarts_skip_nothing(kafka, caplog):
    """
    A watcher stopped at 10; retention then deleted 0-19. Its next start must read from the log
    start (20), not let the client reset to ``latest``, and say at WARNING that 10-19 are gone.
    The position moved there is committed: a second restart resumes from it and skips nothing.
    """
    caplog.set_level(logging.INFO, logger=POSITIONS_LOG)
    topic = kafka.name("t")
    await kafka.create_topics(topic)
    group = kafka.name("g")
    trigger = KafkaSharedStreamTrigger(
        [topic], kafka_config_id=kafka.connection("latest", **LATEST), group_id=group
    )
    own_group = watcher_group_id(group, trigger.watcher_digest())
    await kafka.produce(topic, [{"i": i} for i in range(30)])
    await kafka.commit(group, topic, {0: 10})
    await kafka.commit(own_group, topic, {0: 10})
    tp = TopicPartition(topic, 0)
    await _admin(kafka, lambda admin: admin.delete_records({tp: RecordsToDelete(20)}))
    async with SharedStreamHarness(confirm_after=0.0) as first_start:
        w = first_start.add(trigger)
        await kafka.wait_committed(own_group, topic, {0: 20}, timeout=10)
        await kafka.produce(topic, [{"i": 30}])
        assert await _received_up_to(w, 30) == list(range(20, 31)), "retained records were skipped"
        assert await kafka.wait_committed(own_group, topic, {0: 31}) == {0: 31}
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("10-19" in message and "retention" in message for message in warnings), warnings
    await kafka.produce(topic, [{"i": i} for i in range(31, 35)])  # while nothing runs
    async with SharedStreamHarness(confirm_after=0.0) as second_start:
        again = second_start.add(trigger)
        await kafka.produce(topic, [{"i": 35}])
        assert await _received_up_to(again, 35) == list(range(31, 36)), "the restart skipped"


# -- 6: a coordinator that is loading ----------------------------------------------------------


async def test_a_coordinator_loading_answer_is_asked_again_not_taken_for_a_new_watcher(kafka):
    """
    Stands in for FIDELITY.md's row "Kafka coordinator loading / moved" (never happens on
    noida-db or Tansu; a real coordinator answers OffsetFetch v2+ with a request-level error code
    and no partitions while it loads the group's offsets, or after it moved). A watcher moved
    here with its position at 10, onto a stream that reads at 20, must get 10-19: the loading
    answers are asked again, never read as "this watcher has no position".
    """
    topic = kafka.name("t")
    await kafka.create_topics(topic)
    group = kafka.name("g")
    await kafka.produce(topic, [{"i": i} for i in range(20)])
    await kafka.commit(group, topic, {0: 20})  # where the stream reads on this triggerer
    async with KafkaProtocolProxy(kafka.broker.port) as proxy:
        conn_id = kafka.connection("proxy", **{"bootstrap.servers": proxy.bootstrap})
        trigger = KafkaSharedStreamTrigger([topic], kafka_config_id=conn_id, group_id=group)
        own_group = watcher_group_id(group, trigger.watcher_digest())
        await kafka.commit(own_group, topic, {0: 10})  # where the triggerer that died left it
        proxy.loading[own_group] = 3
        async with SharedStreamHarness(confirm_after=0.0) as triggerer:
            moved = triggerer.add(trigger)
            await kafka.produce(topic, [{"i": 20}])
            assert await _received_up_to(moved, 20) == list(range(10, 21)), "records 10-19 lost"
            assert proxy.loading_answered == 3
            assert moved.error is None
        assert await kafka.committed(own_group, topic) == {0: 21}
