"""The redrive operator's arguments, its loop and its example Dag (brokers: tests/integration)."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from airflow.dag_processing.dagbag import DagBag

from airflow_shared_stream.common.errors import SharedStreamConfigurationError
from airflow_shared_stream.common.redrive import (
    DEFAULT_MAX_MESSAGES,
    RedriveConfigurationError,
    RedriveItem,
    RedriveRoute,
    RedriveSnapshot,
    redrive,
)
from airflow_shared_stream.redrive import RedriveDeadLettersOperator, dead_letter_source

EXAMPLE = Path(__file__).resolve().parents[2] / "example_dags" / "shared_stream_redrive_dead_letters.py"
QUEUE = "http://127.0.0.1:9/000000000000/orders"
DLQ = "http://127.0.0.1:9/000000000000/orders-dlq"


def test_the_example_dag_parses_with_the_params_the_streams_page_sends(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.syspath_prepend(str(EXAMPLE.parent))
    bag = DagBag(dag_folder=str(EXAMPLE))
    assert bag.import_errors == {}
    dag = bag.dags["shared_stream_redrive_dead_letters"]
    assert set(dag.params) == {
        "broker",
        "conn_id",
        "source",
        "dead_letter",
        "filter",
        "max_messages",
        "dry_run",
        "keep_origin_attributes",
        "grant",
    }
    assert dag.params["dry_run"] is True  # a redrive started without a word only counts
    [task] = dag.tasks
    assert isinstance(task, RedriveDeadLettersOperator)
    assert task.require_grant  # its addresses come from conf: only the page's grant lets them through
    sys.modules.pop("shared_stream_redrive_dead_letters", None)


@pytest.mark.parametrize(
    ("arguments", "says"),
    [
        ({"broker": "rabbitmq", "dead_letter": DLQ, "source": QUEUE}, "broker must be one of"),
        ({"broker": "sqs", "dead_letter": DLQ, "source": QUEUE, "filter": "body.["}, "filter is not a valid"),
        ({"broker": "sqs", "dead_letter": DLQ, "source": QUEUE, "max_messages": 0}, "max_messages"),
        ({"broker": "sqs", "dead_letter": DLQ, "source": QUEUE, "dry_run": "perhaps"}, "dry_run"),
        ({"broker": "sqs", "source": QUEUE}, "needs dead_letter"),
        ({"broker": "sqs", "dead_letter": DLQ}, "source queue"),
        ({"broker": "sqs", "dead_letter": DLQ, "source": DLQ + "/"}, "one queue"),
        ({"broker": "sqs", "dead_letter": "orders-dlq", "source": QUEUE}, "not an SQS queue URL"),
        (
            {"broker": "sqs", "dead_letter": DLQ, "source": QUEUE, "broker_options": {"group_id": "g"}},
            "group_id",
        ),
        ({"broker": "kafka", "dead_letter": "orders", "source": "orders"}, "one topic"),
        ({"broker": "pubsub", "dead_letter": "orders-dlq-sub"}, "original topic"),
        ({"broker": "pubsub", "dead_letter": "projects/p/topics/t", "source": "t"}, "not a Pub/Sub sub"),
        ({"broker": "servicebus"}, "needs the entity"),
        (
            {"broker": "servicebus", "source": "orders", "dead_letter": "other"},
            "not the dead-letter sub-queue",
        ),
    ],
)
def test_bad_arguments_fail_when_the_dag_is_parsed(arguments: dict[str, Any], says: str) -> None:
    with pytest.raises(SharedStreamConfigurationError, match=says):
        RedriveDeadLettersOperator(task_id="redrive", **arguments)


def test_template_strings_are_checked_when_the_task_runs() -> None:
    operator = RedriveDeadLettersOperator(task_id="redrive", broker="{{ params.broker }}")
    operator.broker = "rabbitmq"  # as rendered
    with pytest.raises(SharedStreamConfigurationError, match="broker must be one of"):
        operator.execute({})


def test_service_bus_takes_its_own_sub_queue_spelled_out() -> None:
    for spelling in ("orders/$deadletterqueue", "ORDERS/$DeadLetterQueue", "orders"):
        dead_letter_source("servicebus", source="orders", dead_letter=spelling)


class ListSource:
    """An in-memory dead-letter source: the loop's bookkeeping only (the brokers' in integration tests)."""

    broker = "memory"
    label = "memory"
    lease_seconds = 60.0

    def __init__(self, count: int, refuse: set[int] = frozenset()) -> None:  # type: ignore[assignment]
        self.waiting = list(range(count))
        self.refuse = refuse
        self.copied: list[int] = []
        self.removed: list[int] = []
        self.released: list[int] = []
        self.route = RedriveRoute("queue", read_from="dead letters", write_to="orders")
        self.route_once_open: RedriveRoute | None = None
        self.opened = self.closed = False

    async def open(self) -> None:
        self.opened = True
        if self.route_once_open is not None:
            self.route = self.route_once_open

    async def close(self) -> None:
        self.closed = True

    async def snapshot(self) -> RedriveSnapshot:
        return RedriveSnapshot(depth=None, bound="the list")

    async def renew(self, items: Sequence[RedriveItem]) -> None:
        pass

    def held_handle(self, item: RedriveItem) -> Any:
        return item.handle

    async def read(self, limit: int) -> Sequence[RedriveItem]:
        taken, self.waiting = self.waiting[:limit], self.waiting[limit:]
        return [RedriveItem(key=str(n), envelope={"body": {"n": n}}, handle=n) for n in taken]

    async def copy(self, items: Sequence[RedriveItem]) -> Sequence[RedriveItem]:
        accepted = [i for i in items if i.handle not in self.refuse]
        self.copied.extend(i.handle for i in accepted)
        return accepted

    async def remove(self, moved: Sequence[RedriveItem], skipped: Sequence[RedriveItem]) -> None:
        self.removed.extend(i.handle for i in moved)

    async def release(self, items: Sequence[RedriveItem]) -> None:
        self.released.extend(i.handle for i in items)


async def test_refused_copies_stay_and_only_accepted_ones_are_removed() -> None:
    source = ListSource(12, refuse={3, 8})
    summary = await redrive(source, filter="body.n != `5`", batch_size=4)  # type: ignore[arg-type]
    assert (summary.moved, summary.skipped, summary.failed) == (9, 1, 2)
    assert source.removed == source.copied == [0, 1, 2, 4, 6, 7, 9, 10, 11]
    assert sorted(source.released) == [3, 5, 8]


async def test_a_maximum_reads_no_more_than_it_can_move() -> None:
    source = ListSource(10)
    summary = await redrive(source, max_messages=3, filter="body.n != `1`", batch_size=10)  # type: ignore[arg-type]
    assert (summary.moved, summary.skipped) == (3, 1)
    assert source.removed == [0, 2, 3]
    assert source.released == [1]
    assert source.waiting == [4, 5, 6, 7, 8, 9]  # never read


async def test_the_engine_refuses_a_destination_that_is_the_dead_letter_source_before_connecting() -> None:
    source = ListSource(3)
    source.route = RedriveRoute("queue", read_from=("eu", "1", "orders"), write_to=("eu", "1", "orders"))
    with pytest.raises(RedriveConfigurationError, match="are one queue: every message moved would come"):
        await redrive(source)  # type: ignore[arg-type]
    assert not source.opened
    assert source.waiting == [0, 1, 2]
    assert source.copied == []


async def test_the_engine_refuses_a_loop_it_learns_of_only_once_open() -> None:
    """Pub/Sub knows which topic a dead-letter subscription reads only by asking the broker."""
    source = ListSource(3)
    source.route = RedriveRoute("topic", read_from=None, write_to="orders")
    source.route_once_open = RedriveRoute("topic", read_from="orders", write_to="orders")
    with pytest.raises(RedriveConfigurationError, match="are one topic"):
        await redrive(source)  # type: ignore[arg-type]
    assert source.opened
    assert source.closed
    assert source.waiting == [0, 1, 2]
    assert source.copied == []


async def test_a_destination_read_from_each_message_is_no_loop() -> None:
    """Kafka without ``source``: each record goes to the topic its origin header names."""
    source = ListSource(2)
    source.route = RedriveRoute("topic", read_from="orders.dlq", write_to=None)
    summary = await redrive(source)  # type: ignore[arg-type]
    assert summary.moved == 2


async def test_no_maximum_is_the_default_maximum_never_unbounded() -> None:
    source = ListSource(DEFAULT_MAX_MESSAGES + 7)
    summary = await redrive(source, max_messages=None)  # type: ignore[arg-type]
    assert summary.moved == DEFAULT_MAX_MESSAGES
    assert len(source.waiting) == 7


def test_a_blank_max_messages_rendered_by_the_dag_is_the_default() -> None:
    operator = RedriveDeadLettersOperator(
        task_id="redrive",
        broker="sqs",
        dead_letter=DLQ,
        source=QUEUE,
        max_messages="{{ params.max_messages }}",
    )
    for blank in (None, "", "None"):
        operator.max_messages = blank  # as rendered from a blank field
        assert operator._arguments()[2] == DEFAULT_MAX_MESSAGES


async def test_a_read_of_messages_already_held_does_not_end_the_redrive() -> None:
    """A lease that ran out hands a held message out again: the redrive reads on to the rest."""
    source = ListSource(6)
    read = source.read
    calls = 0

    async def returning_first(limit: int) -> Sequence[RedriveItem]:
        nonlocal calls
        calls += 1
        if calls == 2:
            return [RedriveItem(key="0", envelope={"body": {"n": 0}}, handle=0)]
        return await read(limit)

    source.read = returning_first  # type: ignore[method-assign]
    summary = await redrive(source, filter="body.n != `0`", batch_size=3)  # type: ignore[arg-type]
    assert (summary.examined, summary.moved, summary.skipped, summary.left) == (6, 5, 1, 1)
