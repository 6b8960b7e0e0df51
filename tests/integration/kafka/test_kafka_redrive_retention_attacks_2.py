"""
A Kafka redrive as a member of its consumer group (issue 45, merged in 3ff938b:
``RedriveMembership._keep_committed``, ``_waiting``, the ``epoch - 1`` rule of ``commit``,
``PositionStore.commit_asking_again``), attacked again with FAULT_MODEL classes 5, 11 and 15 on
real Kafka-protocol brokers.

Each test says what it shows; a break is a strict ``xfail`` until it is fixed.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from airflow_shared_stream.common.redrive import redrive
from airflow_shared_stream.kafka.redrive import KafkaDeadLetterSource, default_group_id
from airflow_shared_stream.redrive import dead_letter_source
from tests.integration.kafka.conftest import KafkaSandbox
from tests.integration.kafka.test_kafka_redrive import dead_letters, source, topics

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]


# noida-db never completes a rebalance without a member that stopped polling (TEST_RIG.md,
# test_kafka_redrive_retention_attacks.py): the second redrive would wait for the first for ever.
@pytest.mark.parametrize("kafka_broker", ["tansu"], indirect=True)
async def test_a_redrive_put_out_of_its_group_never_commits_another_redrive_back(
    kafka: KafkaSandbox, monkeypatch: pytest.MonkeyPatch
) -> None:
    """
    FAULT_MODEL 5 (the redrive's partitions are a lease: a lost lease means the records *of that
    lease* come again, never more) and 15 (an operator action copies each real message once; two
    redrives at once). Redrive A reads a batch and copies it slowly, past ``max.poll.interval.ms``:
    aiokafka's heartbeat leaves the group and resets the member to generation -1 and an empty
    member id. Redrive B (the next Dag run, a retry) joins the group alone, gets the partition,
    copies all ten records (A's batch again: the documented duplicate) and commits 10, then ends
    and leaves: the group is empty. A's batch ends and ``RedriveMembership.commit`` commits it "as
    the member" with what ``consumer._coordinator`` says now: generation -1, no member id, a
    *simple* commit, which Kafka accepts from anyone while the group is empty (``generationId < 0
    && group is Empty``). The group's offset goes back from 10 to 5 (or, where the broker fences it,
    the fenced path commits the same 5 again once A is reassigned), and records 5..9, which B
    copied and A never held, are copied again (by A reading on, or by the next redrive). Expected:
    a commit is made only with the generation the batch was read in; a member put out of the group
    commits nothing (its batch goes to whoever holds the partition: a duplicate of its own batch).
    """
    dlq, origin = await topics(kafka)
    await dead_letters(kafka, dlq, origin, 10)
    group = default_group_id(dlq, origin)
    slow = kafka.connection(
        "slow",
        **{"max.poll.interval.ms": "6000", "session.timeout.ms": "6000", "heartbeat.interval.ms": "1000"},
    )
    real_copy = KafkaDeadLetterSource.copy
    state: dict[str, Any] = {"armed": True, "out": False, "b": None}

    async def copy_past_the_poll_interval(self: KafkaDeadLetterSource, items: Any) -> Any:
        if state["armed"]:
            state["armed"] = False
            consumer = self._consumer
            assert consumer is not None
            loop = asyncio.get_running_loop()
            until = loop.time() + 60
            while loop.time() < until:  # aiokafka's heartbeat leaves the group (poll interval passed)
                if consumer._coordinator.generation == -1:
                    state["out"] = True
                    break
                await asyncio.sleep(0.1)
            # The next redrive of the same group, run to its end while A still copies its batch.
            state["b"] = await redrive(source(kafka, dlq, source=origin))
        return await real_copy(self, items)

    monkeypatch.setattr(KafkaDeadLetterSource, "copy", copy_past_the_poll_interval)
    first = await asyncio.wait_for(
        redrive(dead_letter_source("kafka", source=origin, dead_letter=dlq, conn_id=slow), batch_size=5), 120
    )
    second = state["b"]
    assert state["out"], "the slow redrive was never put out of its group"
    assert second is not None
    assert second.moved == 10, second
    monkeypatch.setattr(KafkaDeadLetterSource, "copy", real_copy)
    after = await kafka.committed(group, dlq)
    third = await redrive(source(kafka, dlq, source=origin))
    copies = first.moved + second.moved + third.moved
    assert copies == 15, (
        f"{copies} copies of 10 dead letters (A {first.moved}, B {second.moved}, then {third.moved}; the "
        f"group's offset after A and B: {after}): A's batch of 5 twice is the lost lease's duplicate, "
        "the rest was committed back by a member put out of its group"
    )
