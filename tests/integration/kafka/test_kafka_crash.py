"""A consumer killed with SIGKILL mid-stream: its successor finishes the stream, nothing lost."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from airflow_shared_stream.kafka.trigger import KafkaSharedStreamTrigger
from airflow_shared_stream.testing import SharedStreamHarness

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

REPO = Path(__file__).resolve().parents[3]
COUNT = 1000


async def read_events(proc: asyncio.subprocess.Process, seen: list[str], until: int) -> None:
    assert proc.stdout is not None
    while len(seen) < until:
        line = await proc.stdout.readline()
        if not line:
            raise AssertionError(f"the consumer process exited after {len(seen)} events")
        if line.startswith(b"EVENT "):
            seen.append(line[6:].decode().strip())


# noida-db never evicts a member that died without leaving (TEST_RIG.md): its partitions stay
# assigned to the dead member and a successor waits forever. Tansu evicts it after the session
# timeout (~10 s), which is what a Kafka cluster does.
@pytest.mark.parametrize("kafka_broker", ["tansu"], indirect=True)
async def test_consumer_killed_mid_stream_loses_nothing(kafka):
    topic = kafka.name("t")
    await kafka.create_topics(topic)
    group = kafka.name("g")
    values = [f"m{i}" for i in range(COUNT)]
    await kafka.produce(topic, values)

    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "tests.support.kafka_child_consumer", topic, kafka.conn_id, group,
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env, cwd=REPO, start_new_session=True,
    )  # fmt: skip
    before: list[str] = []
    try:
        await asyncio.wait_for(read_events(proc, before, until=100), 90)
        committed_before = (await kafka.committed(group, topic))[0]
    finally:
        os.kill(proc.pid, signal.SIGKILL)  # no leave-group, no final commit, no socket close
        await proc.wait()
    assert len(before) < COUNT, "the stream finished before the kill: nothing was tested"

    # A new consumer of the same group: joins once the broker has evicted the dead member.
    async with SharedStreamHarness(confirm_after=0.0) as h:
        w = h.add(
            KafkaSharedStreamTrigger([topic], kafka_config_id=kafka.conn_id, group_id=group, max_in_flight=10)
        )
        await w.wait_for_events(1, timeout=90)
        deadline = asyncio.get_running_loop().time() + 90
        while (await kafka.committed(group, topic))[0] != COUNT:
            assert asyncio.get_running_loop().time() < deadline, "the successor never finished the stream"
            await asyncio.sleep(0.5)
        after = [p["value"] for p in w.payloads]

    # At least once: every message reached a watcher; the successor resumed from the last commit.
    assert set(before) | set(after) == set(values)
    first_after = int(after[0][1:])
    assert first_after <= len(before), "messages between the dead consumer and its successor were skipped"
    assert first_after >= (committed_before or 0), "the successor did not resume from the group's commit"
    assert after == values[first_after:]
