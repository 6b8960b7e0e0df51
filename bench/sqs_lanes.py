"""
Which advance-lane scheme should a standard SQS queue use? Measure, don't guess.

A standard queue has no order, so the lane only decides how settlements are batched and how far
one slow message holds others back. Three schemes, same run, same broker (moto's SQS server on
loopback), same load: N messages, 3 watchers, persistence confirmed after a random delay
(mostly a state-sync round, sometimes a slow transaction):

- ``global``: one lane for the whole queue (largest batches, worst head-of-line blocking);
- ``receive``: one lane per receive call of up to 10 messages (the producer's default);
- ``message``: one lane per message (no blocking, one API call per settlement).

The anchor, measured in the same run: a bare aiobotocore loop that receives 10 and deletes them,
with no Airflow in between (one consumer, no watchers, no persistence wait): the broker's speed
on this machine.

Reported: wall time until every watcher has every message and the queue is empty, messages/s,
and SQS API calls by operation. Results go to bench/results/sqs_lanes.md.

Run: .venv/bin/python bench/sqs_lanes.py [--messages 1500]
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import os
import random
import sys
import time
from pathlib import Path
from typing import Any, ClassVar

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import boto3  # noqa: E402

from airflow_shared_stream.common.leased_queue import InFlight  # noqa: E402
from airflow_shared_stream.sqs.producer import SqsSharedStreamProducer  # noqa: E402
from airflow_shared_stream.sqs.trigger import SqsSharedStreamTrigger  # noqa: E402
from airflow_shared_stream.testing import SharedStreamHarness  # noqa: E402
from bench.machine import describe  # noqa: E402
from tests.support.processes import free_port, running, wait_for_port  # noqa: E402


class LaneProducer(SqsSharedStreamProducer):
    scheme: ClassVar[str] = "receive"
    calls: ClassVar[collections.Counter[str]] = collections.Counter()

    def get_advance_lane(self, broker_payload: InFlight[Any]) -> Any:
        if self.scheme == "global":
            return None
        if self.scheme == "message":
            return broker_payload.delivery.message_id
        return super().get_advance_lane(broker_payload)

    async def _call(self, operation: str, *, queue: Any = None, **params: Any) -> dict[str, Any]:
        self.calls[operation] += 1
        return await super()._call(operation, queue=queue, **params)


class LaneTrigger(SqsSharedStreamTrigger):
    producer_class = LaneProducer


def persistence_delay(rng: random.Random) -> float:
    """A state-sync round (0.2-1.4 s) for most events; a slow 4 s transaction for 3% of them."""
    return 4.0 if rng.random() < 0.03 else rng.uniform(0.2, 1.4)


async def run_scheme(scheme: str, client: Any, messages: int, max_in_flight: int) -> dict[str, Any]:
    url = client.create_queue(QueueName=f"lanes-{scheme}-{time.time_ns()}")["QueueUrl"]
    for start in range(0, messages, 10):
        entries = [{"Id": str(i), "MessageBody": json.dumps({"n": start + i})} for i in range(10)]
        client.send_message_batch(QueueUrl=url, Entries=entries[: messages - start])
    LaneProducer.scheme = scheme
    LaneProducer.calls = collections.Counter()
    rng = random.Random(42)
    started = time.monotonic()
    async with SharedStreamHarness(confirm_after=lambda: persistence_delay(rng)) as harness:
        watchers = [harness.add(LaneTrigger(url, max_in_flight=max_in_flight)) for _ in range(3)]
        for watcher in watchers:
            await watcher.wait_for_events(messages, timeout=900)
        while True:
            attrs = client.get_queue_attributes(
                QueueUrl=url,
                AttributeNames=["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"],
            )["Attributes"]
            if attrs["ApproximateNumberOfMessages"] == attrs["ApproximateNumberOfMessagesNotVisible"] == "0":
                break
            await asyncio.sleep(0.05)
        elapsed = time.monotonic() - started
    calls = dict(LaneProducer.calls)
    return {"scheme": scheme, "seconds": elapsed, "rate": messages / elapsed, "calls": calls}


async def run_bare_loop(client: Any, endpoint: str, messages: int) -> dict[str, Any]:
    """The broker's own ceiling here: receive 10, delete 10, no Airflow in between."""
    from aiobotocore.session import get_session

    url = client.create_queue(QueueName=f"lanes-bare-{time.time_ns()}")["QueueUrl"]
    for start in range(0, messages, 10):
        entries = [{"Id": str(i), "MessageBody": json.dumps({"n": start + i})} for i in range(10)]
        client.send_message_batch(QueueUrl=url, Entries=entries[: messages - start])
    calls: collections.Counter[str] = collections.Counter()
    done = 0
    started = time.monotonic()
    async with get_session().create_client(
        "sqs",
        region_name="us-east-1",
        endpoint_url=endpoint,
        aws_access_key_id="bench",
        aws_secret_access_key="bench",
    ) as sqs:
        while done < messages:
            received = (
                await sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10, WaitTimeSeconds=1)
            ).get("Messages", [])
            calls["ReceiveMessage"] += 1
            if received:
                entries = [
                    {"Id": str(i), "ReceiptHandle": m["ReceiptHandle"]} for i, m in enumerate(received)
                ]
                await sqs.delete_message_batch(QueueUrl=url, Entries=entries)
                calls["DeleteMessageBatch"] += 1
                done += len(received)
    elapsed = time.monotonic() - started
    return {
        "scheme": "bare aiobotocore loop",
        "seconds": elapsed,
        "rate": messages / elapsed,
        "calls": dict(calls),
    }


async def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--messages", type=int, default=1500)
    parser.add_argument("--max-in-flight", type=int, default=200)
    parser.add_argument("--schemes", nargs="+", default=["global", "receive", "message"])
    parser.add_argument("--output", type=Path, default=ROOT / "bench" / "results" / "sqs_lanes.md")
    args = parser.parse_args()

    # moto in its own process, so the broker does not share a GIL with the code under test.
    port = free_port()
    moto = running(
        [sys.executable, "-m", "tests.support.moto_sqs", "-H", "127.0.0.1", "-p", str(port)],
        log_path=Path("/tmp") / f"sqs-lanes-moto-{port}.log",
        cwd=ROOT,  # moto guarded against its own races (tests/support/moto_sqs.py)
    )
    proc = moto.__enter__()
    wait_for_port(port, 60, proc=proc, what="moto")
    endpoint = f"http://127.0.0.1:{port}"
    os.environ["AIRFLOW_CONN_AWS_DEFAULT"] = json.dumps(
        {
            "conn_type": "aws",
            "login": "bench",
            "password": "bench",
            "extra": {"region_name": "us-east-1", "endpoint_url": endpoint},
        }
    )
    client = boto3.client(
        "sqs",
        region_name="us-east-1",
        endpoint_url=endpoint,
        aws_access_key_id="bench",
        aws_secret_access_key="bench",
    )
    results = []
    try:
        bare = await run_bare_loop(client, endpoint, args.messages)
        print(f"bare     {bare['seconds']:7.1f} s {bare['rate']:7.1f} msg/s {bare['calls']}", flush=True)
        results.append(bare)
        for scheme in args.schemes:
            result = await run_scheme(scheme, client, args.messages, args.max_in_flight)
            print(
                f"{scheme:8s} {result['seconds']:7.1f} s {result['rate']:7.1f} msg/s {result['calls']}",
                flush=True,
            )
            results.append(result)
    finally:
        moto.__exit__(None, None, None)

    ops = ["ReceiveMessage", "DeleteMessageBatch", "ChangeMessageVisibilityBatch"]
    lines = [
        "# SQS advance lanes on a standard queue",
        "",
        f"{args.messages} messages, 3 watchers, max_in_flight={args.max_in_flight}, persistence confirmed "
        "after 0.2-1.4 s (3% after 4 s); moto SQS server (own process) on loopback. "
        "Produced by `bench/sqs_lanes.py`.",
        "",
        describe(["apache-airflow", "aiobotocore", "moto"]),
        "",
        "| lane scheme | seconds | messages/s | " + " | ".join(ops) + " |",
        "| --- | ---: | ---: | " + " | ".join("---:" for _ in ops) + " |",
    ]
    for r in results:
        calls = " | ".join(str(r["calls"].get(op, 0)) for op in ops)
        lines.append(f"| {r['scheme']} | {r['seconds']:.1f} | {r['rate']:.1f} | {calls} |")
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text("\n".join(lines) + "\n")
    print(f"wrote {args.output}")


if __name__ == "__main__":
    asyncio.run(main())
