"""
SQS redrive bounds on a real SQS API (moto's server): the snapshot, held leases, the report.

Issue 45 items 1 and 11: a redrive examines no more than the queue's depth when it started (copies
dead-lettered again are the next redrive's), keeps the messages its filter skipped hidden while
it reads on (their leases renewed), reads on to its snapshot, and says what it examined, moved,
skipped and left.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Sequence

import pytest

from airflow_shared_stream.common.redrive import RedriveItem, redrive
from airflow_shared_stream.redrive import RedriveDeadLettersOperator
from tests.integration.sqs.test_sqs_redrive import ours, source
from tests.support.brokers import SqsServer


async def test_an_sqs_redrive_stops_at_the_depth_it_started_with(sqs: SqsServer, aws_connection: str) -> None:
    """Every copy comes straight back to the dead-letter queue: the redrive never chases it."""
    dlq = sqs.create_queue()
    origin = sqs.create_queue(dead_letter_queue_url=dlq)
    stamp = ours(sqs, origin)
    sqs.send(dlq, [json.dumps({"n": i}) for i in range(6)], MessageAttributes=stamp)

    async def rejected_again(step: str, items: Sequence[RedriveItem]) -> None:
        if step == "copied" and items:
            await asyncio.to_thread(sqs.send, dlq, [i.handle["Body"] for i in items])

    summary = await redrive(
        source(aws_connection, dlq, origin), max_messages=50, checkpoint=rejected_again, batch_size=2
    )

    assert summary.moved == 6  # not one copy chased
    assert len(sqs.drain(origin)) == 6
    assert len(sqs.drain(dlq)) == 6  # the copies that came back: the next redrive's
    assert (summary.snapshot, summary.examined, summary.left) == (6, 6, 0)


async def test_a_filtered_redrive_keeps_what_it_skipped_hidden_and_reads_on_to_its_snapshot(
    sqs: SqsServer, aws_connection: str
) -> None:
    """The redrive is held up longer than its lease (a slow copy, a loaded worker) mid-run."""
    dlq = sqs.create_queue()
    origin = sqs.create_queue(dead_letter_queue_url=dlq)
    lease = 3
    stamp = ours(sqs, origin)
    sqs.send(dlq, [json.dumps({"n": i, "type": "other"}) for i in range(40)], MessageAttributes=stamp)
    sqs.send(dlq, [json.dumps({"n": i, "type": "fixed"}) for i in range(40, 45)], MessageAttributes=stamp)
    dead_letter_source = source(aws_connection, dlq, origin, lease_seconds=lease)
    read = dead_letter_source.read
    reads = 0
    visible_while_held: list[int] = []

    async def read_held_up_once(limit: int) -> Sequence[RedriveItem]:
        nonlocal reads
        reads += 1
        if reads == 3:  # 20 skipped ones held: their first lease runs out twice over
            await asyncio.sleep(2 * lease)
            visible_while_held.append((await asyncio.to_thread(sqs.depth, dlq)).visible)
        return await read(limit)

    dead_letter_source.read = read_held_up_once
    summary = await redrive(dead_letter_source, filter="body.type == 'fixed'", batch_size=10)

    assert summary.moved == 5  # the matching ones were read, after the held ones
    assert visible_while_held == [25]  # the 20 held stayed hidden: their leases were renewed
    assert sorted(json.loads(m["Body"])["n"] for m in sqs.drain(origin)) == list(range(40, 45))
    assert (summary.examined, summary.skipped, summary.left) == (45, 40, 40)
    assert len(sqs.drain(dlq)) == 40  # given back at the end


def test_the_operator_reports_examined_moved_skipped_left(
    sqs: SqsServer, aws_connection: str, caplog: pytest.LogCaptureFixture
) -> None:
    dlq = sqs.create_queue()
    origin = sqs.create_queue(dead_letter_queue_url=dlq)
    stamp = ours(sqs, origin)
    sqs.send(
        dlq, [json.dumps({"n": i, "type": "a" if i % 2 else "b"}) for i in range(8)], MessageAttributes=stamp
    )
    operator = RedriveDeadLettersOperator(
        task_id="redrive",
        broker="sqs",
        source=origin,
        dead_letter=dlq,
        conn_id=aws_connection,
        filter="body.type == 'a'",
        max_messages=None,  # a blank field: the default, never unbounded
    )

    with caplog.at_level(logging.INFO):
        summary = operator.execute({})

    assert {k: summary[k] for k in ("examined", "moved", "skipped", "failed", "left", "snapshot")} == {
        "examined": 8,
        "moved": 4,
        "skipped": 4,
        "failed": 0,
        "left": 4,
        "snapshot": 8,
    }
    assert "examined 8, moved 4, skipped by filter 4, failed 0, left 4" in caplog.text
