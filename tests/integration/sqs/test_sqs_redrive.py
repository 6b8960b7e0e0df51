"""Dead-letter redrive on a real SQS API (moto's server): every path of docs/redrive.rst."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from airflow_shared_stream.common.redrive import redrive
from airflow_shared_stream.redrive import RedriveDeadLettersOperator, dead_letter_source
from airflow_shared_stream.sqs.errors import SqsQueueNotFoundError, SqsSharedStreamError
from tests.integration.sqs.conftest import SECRET_KEY
from tests.support.brokers import SqsServer
from tests.support.redrive_child import kill_between_copy_and_remove
from tests.support.waiting import eventually

OURS = {
    "dead_letter_reason": {"DataType": "String", "StringValue": "rejected"},
    "dead_letter_description": {"DataType": "String", "StringValue": "reject expression matched"},
}


def ours(sqs: SqsServer, origin: str) -> dict[str, Any]:
    """The attributes our dead-lettering writes on a copy of ``origin``'s message: reason and origin."""
    return {**OURS, "dead_letter_origin_queue": {"DataType": "String", "StringValue": sqs.arn(origin)}}


def dead_letters(sqs: SqsServer, dlq: str, origin: str, count: int, **extra: Any) -> list[str]:
    """``count`` messages on ``dlq`` as our dead-lettering writes them (theirs, our reason, the origin)."""
    bodies = [json.dumps({"n": i, "type": "a" if i % 2 else "b"}) for i in range(count)]
    stamp = ours(sqs, origin)
    sqs.send(
        dlq,
        bodies,
        MessageAttributes=lambda i: {"tenant": {"DataType": "String", "StringValue": f"t{i}"}, **stamp},
        **extra,
    )
    return bodies


def source(sqs_conn: str, dlq: str, origin: str, **kwargs: Any) -> Any:
    return dead_letter_source(
        "sqs",
        source=origin,
        dead_letter=dlq,
        conn_id=sqs_conn,
        keep_origin_attributes=kwargs.pop("keep", False),
        broker_options={"lease_seconds": kwargs.pop("lease_seconds", 30)},
    )


async def test_redrive_moves_every_message_with_its_attributes(sqs: SqsServer, aws_connection: str) -> None:
    dlq, origin = sqs.create_queue(), sqs.create_queue()
    bodies = dead_letters(sqs, dlq, origin, 15)

    summary = await redrive(source(aws_connection, dlq, origin))

    assert (summary.moved, summary.skipped, summary.failed) == (15, 0, 0)
    moved = sqs.drain(origin)
    assert sorted(m["Body"] for m in moved) == sorted(bodies)
    for message in moved:
        attributes = message["MessageAttributes"]
        assert attributes["tenant"]["StringValue"] == f"t{json.loads(message['Body'])['n']}"
        assert "dead_letter_reason" not in attributes
        assert "dead_letter_description" not in attributes
    assert sqs.depth(dlq) == (0, 0)


async def test_keep_origin_attributes_keeps_the_dead_letter_reason(
    sqs: SqsServer, aws_connection: str
) -> None:
    dlq, origin = sqs.create_queue(), sqs.create_queue()
    dead_letters(sqs, dlq, origin, 3)

    await redrive(source(aws_connection, dlq, origin, keep=True))

    moved = sqs.drain(origin)
    assert len(moved) == 3
    assert all(m["MessageAttributes"]["dead_letter_reason"]["StringValue"] == "rejected" for m in moved)


async def test_fifo_redrive_keeps_each_group_and_its_order(sqs: SqsServer, aws_connection: str) -> None:
    dlq, origin = sqs.create_queue(fifo=True), sqs.create_queue(fifo=True)
    bodies = dead_letters(
        sqs, dlq, origin, 12, MessageGroupId=lambda i: f"g{i % 3}", MessageDeduplicationId=lambda i: f"d{i}"
    )

    summary = await redrive(source(aws_connection, dlq, origin))

    assert summary.moved == 12
    moved = sqs.drain(origin)
    groups: dict[str, list[int]] = {}
    for message in moved:
        groups.setdefault(message["Attributes"]["MessageGroupId"], []).append(
            json.loads(message["Body"])["n"]
        )
    assert groups == {f"g{g}": [i for i in range(12) if i % 3 == g] for g in range(3)}
    assert sorted(m["Body"] for m in moved) == sorted(bodies)


async def test_filter_moves_only_what_it_selects(sqs: SqsServer, aws_connection: str) -> None:
    dlq, origin = sqs.create_queue(), sqs.create_queue()
    dead_letters(sqs, dlq, origin, 10)

    summary = await redrive(
        source(aws_connection, dlq, origin), filter="body.type == 'a' && message_attributes.tenant != 't1'"
    )

    assert (summary.moved, summary.skipped) == (4, 6)
    assert sorted(json.loads(m["Body"])["n"] for m in sqs.drain(origin)) == [3, 5, 7, 9]
    assert sorted(json.loads(m["Body"])["n"] for m in sqs.drain(dlq)) == [0, 1, 2, 4, 6, 8]


async def test_max_messages_moves_no_more(sqs: SqsServer, aws_connection: str) -> None:
    dlq, origin = sqs.create_queue(), sqs.create_queue()
    dead_letters(sqs, dlq, origin, 25)

    summary = await redrive(source(aws_connection, dlq, origin), max_messages=12)

    assert summary.moved == 12
    assert len(sqs.drain(origin)) == 12
    assert len(sqs.drain(dlq)) == 13


async def test_dry_run_changes_nothing(sqs: SqsServer, aws_connection: str) -> None:
    dlq, origin = sqs.create_queue(), sqs.create_queue()
    bodies = dead_letters(sqs, dlq, origin, 7)

    summary = await redrive(source(aws_connection, dlq, origin), dry_run=True, filter="body.type == 'b'")

    assert (summary.moved, summary.skipped, summary.dry_run) == (4, 3, True)
    assert [s["body"]["type"] for s in summary.samples] == ["b"] * 4
    assert sqs.depth(origin) == (0, 0)
    assert sorted(m["Body"] for m in sqs.drain(dlq)) == sorted(bodies)  # all visible again


async def test_a_redrive_killed_between_copy_and_delete_loses_nothing(
    sqs: SqsServer, aws_connection: str
) -> None:
    dlq, origin = sqs.create_queue(), sqs.create_queue()
    bodies = dead_letters(sqs, dlq, origin, 25)

    line = await asyncio.to_thread(
        kill_between_copy_and_remove,
        "sqs",
        source=origin,
        dead_letter=dlq,
        conn_id=aws_connection,
        keep_origin_attributes=False,
        broker_options={"lease_seconds": 2},
    )

    copied = int(line.split()[1])
    assert copied == 10
    at_origin = {m["Body"] for m in sqs.drain(origin)}
    assert len(at_origin) == copied
    in_dlq: set[str] = set()

    def drained() -> set[str]:  # the killed redrive's lease runs out: they come back
        in_dlq.update(m["Body"] for m in sqs.drain(dlq))
        return in_dlq

    await eventually(
        drained, lambda found: found == set(bodies), timeout=60, what="every message back in the DLQ"
    )
    assert at_origin <= in_dlq  # copied and not yet deleted: a duplicate, never a loss


def test_operator_returns_the_summary_and_takes_template_strings(sqs: SqsServer, aws_connection: str) -> None:
    dlq, origin = sqs.create_queue(), sqs.create_queue()
    dead_letters(sqs, dlq, origin, 4)
    operator = RedriveDeadLettersOperator(
        task_id="redrive",
        broker="sqs",
        source=origin,
        dead_letter=dlq,
        conn_id=aws_connection,
        max_messages="3",
        dry_run="false",
        keep_origin_attributes="False",
    )

    summary = operator.execute({})

    assert {k: summary[k] for k in ("moved", "skipped", "failed", "dry_run")} == {
        "moved": 3,
        "skipped": 0,
        "failed": 0,
        "dry_run": False,
    }
    assert SECRET_KEY not in json.dumps(summary)  # an XCom, and no secret in it
    assert len(sqs.drain(origin)) == 3


async def test_a_copy_sqs_refuses_stays_in_the_dead_letter_queue(sqs: SqsServer, aws_connection: str) -> None:
    """
    The source queue takes messages of at most 1 KiB; the dead letter is larger.

    SQS reports such an entry in ``Failed``; moto refuses the whole batch instead: either way the
    message must still be in the dead-letter queue, and nowhere else.
    """
    dlq = sqs.create_queue()
    origin = sqs.create_queue(MaximumMessageSize="1024", dead_letter_queue_url=dlq)
    big = json.dumps({"n": 0, "pad": "x" * 2000})
    sqs.send(dlq, [big], MessageAttributes=ours(sqs, origin))

    try:
        summary = await redrive(source(aws_connection, dlq, origin, lease_seconds=1))
    except SqsSharedStreamError:
        pass
    else:
        assert (summary.moved, summary.failed) == (0, 1)

    back = await eventually(lambda: sqs.drain(dlq), bool, timeout=60, what="the dead letter back in the DLQ")
    assert [m["Body"] for m in back] == [big]
    assert sqs.depth(origin) == (0, 0)


async def test_a_missing_queue_is_named_in_a_clear_error(sqs: SqsServer, aws_connection: str) -> None:
    dlq = sqs.create_queue()
    missing = dlq.rsplit("/", 1)[0] + "/no-such-queue"

    with pytest.raises(SqsQueueNotFoundError, match="no-such-queue"):
        await redrive(source(aws_connection, dlq, missing))
