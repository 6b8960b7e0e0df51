"""
A triggerer stand-in in its own process, for the Kafka crash test: one watcher, printed events.

Run as ``python -m tests.support.kafka_child_consumer <topic> <conn_id> <group_id>`` with the
connection in ``AIRFLOW_CONN_<ID>``. Each trigger event is printed (``EVENT <value>``, flushed)
as soon as it is bound; persistence is confirmed after ``confirm_after`` seconds, as the
triggerer's state sync would. The parent kills this process with SIGKILL mid-stream: nothing
here gets to leave the group, flush a commit or close a socket.
"""

from __future__ import annotations

import asyncio
import sys

from airflow_shared_stream.kafka.trigger import KafkaSharedStreamTrigger
from airflow_shared_stream.testing import SharedStreamHarness


async def main(topic: str, conn_id: str, group_id: str) -> None:
    trigger = KafkaSharedStreamTrigger([topic], kafka_config_id=conn_id, group_id=group_id, max_in_flight=10)
    async with SharedStreamHarness(confirm_after=0.05) as harness:
        watcher = harness.add(trigger)
        printed = 0
        while True:
            await watcher.wait_for_events(printed + 1, timeout=3600)
            for payload in watcher.payloads[printed:]:
                print(f"EVENT {payload['value']}", flush=True)
            printed = len(watcher.payloads)


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:4]))
