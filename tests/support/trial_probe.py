"""
Run by tests/integration/test_local_trials.py after a documented local trial (docs/local-trials.rst).

``python trial_probe.py BROKER SEND_SCRIPT``, in the environment the trial's commands left (its
connection variables, ``QUEUE_URL``, ``PUBSUB_EMULATOR_HOST``): starts the watcher a user's Dag would
declare on the trial's queue or topic, through Airflow's real shared-stream manager, runs the trial's
send script until the watcher fires (a new Kafka watcher starts at the topic's end, so a message
sent before it consumes is not its), and prints the first event's message body as one line of JSON.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sys
from typing import Any

BODY = {"kafka": "value"}
"""Where each broker's envelope holds the message's decoded body (``body`` for the others)."""


def body_field(broker: str) -> str:
    return BODY.get(broker, "body")


def watcher_trigger(broker: str) -> Any:
    match = f"{body_field(broker)}.type == 'order_created'"
    if broker == "sqs":
        from airflow_shared_stream.sqs import SqsSharedStreamTrigger

        return SqsSharedStreamTrigger(os.environ["QUEUE_URL"], aws_conn_id="aws_default", match=match)
    if broker == "kafka":
        from airflow_shared_stream.kafka import KafkaSharedStreamTrigger

        return KafkaSharedStreamTrigger("orders", kafka_config_id="kafka_default", match=match)
    if broker == "pubsub":
        from airflow_shared_stream.pubsub import PubSubSharedStreamTrigger

        return PubSubSharedStreamTrigger("projects/local-trial/subscriptions/orders", match=match)
    from airflow_shared_stream.servicebus import ServiceBusSharedStreamTrigger

    return ServiceBusSharedStreamTrigger(queue_name="queue.1", match=match)


async def send_until_fired(send_script: str, fired: asyncio.Future[Any]) -> None:
    """Send one message, then another each time the last send is done and nothing fired yet."""
    while not fired.done():
        sender = await asyncio.create_subprocess_exec(sys.executable, send_script)
        assert await sender.wait() == 0, f"{send_script} failed"
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(asyncio.shield(fired), timeout=2)


async def first_event(broker: str, send_script: str) -> Any:
    from airflow_shared_stream.testing import SharedStreamHarness

    async with SharedStreamHarness(confirm_after=0.0) as harness:
        watcher = harness.add(watcher_trigger(broker))
        fired = asyncio.ensure_future(watcher.wait_for_events(1, timeout=240))
        sending = asyncio.ensure_future(send_until_fired(send_script, fired))
        [event] = await fired
        await sending
    return event.payload[body_field(broker)]


def main() -> None:
    broker, send_script = sys.argv[1:3]
    print(json.dumps(asyncio.run(first_event(broker, send_script)), default=str))


if __name__ == "__main__":
    main()
