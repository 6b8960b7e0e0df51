"""How the api-server groups trigger rows into streams, merges figures and names warnings (no database)."""

from __future__ import annotations

from datetime import datetime, timezone

from airflow_shared_stream.common.figures import figures_stream_id
from airflow_shared_stream.console.streams import (
    Stream,
    _finish,
    group_streams,
    merge_figures,
    without_userinfo,
)

SQS = "airflow_shared_stream.sqs.trigger.SqsSharedStreamTrigger"
QUEUE = "https://sqs.us-east-1.amazonaws.com/000000000000/orders"
DLQ = "https://sqs.us-east-1.amazonaws.com/000000000000/orders-dlq"
NOW = datetime(2026, 1, 1, tzinfo=timezone.utc)


def _rows() -> list[tuple[int, str, dict[str, object], int | None]]:
    common = {"queue_url": QUEUE, "aws_conn_id": "aws_default", "dead_letter_queue_url": DLQ}
    return [
        (1, SQS, {**common, "match": "body.a"}, 10),
        (2, SQS, {**common, "queue_url": QUEUE.replace("sqs.us-east-1", "SQS.US-EAST-1"), "match": None}, 11),
        (3, "airflow.providers.other.Trigger", {"x": 1}, 10),
    ]


def test_watchers_of_one_queue_are_one_stream_whatever_they_are_called() -> None:
    (stream,) = group_streams(_rows())
    assert [w.trigger_id for w in stream.watchers] == [1, 2]
    assert stream.broker == "sqs"
    assert stream.upstream == {"queue_url": QUEUE}
    assert stream.connection_id == "aws_default"
    assert stream.dead_letter == DLQ
    assert stream.redrive_params == {
        "broker": "sqs",
        "conn_id": "aws_default",
        "source": QUEUE,
        "dead_letter": DLQ,
    }
    assert "producer_kwargs" not in stream.to_json()
    assert "redrive_params" not in stream.to_json()


def test_where_a_stream_dead_letters_is_the_brokers_own_word_when_it_names_no_destination() -> None:
    """The page shows it from the broker's operations (``own_dead_letter``), naming no broker."""
    servicebus = "airflow_shared_stream.servicebus.trigger.ServiceBusSharedStreamTrigger"
    rows = [(1, servicebus, {"queue_name": "orders"}, 10), *_rows()]
    by_broker = {stream.broker: stream.to_json() for stream in group_streams(rows)}
    assert by_broker["servicebus"]["dead_letter"] is None
    assert by_broker["servicebus"]["own_dead_letter"] == "the entity's $deadletterqueue"
    assert by_broker["sqs"]["own_dead_letter"] is None


def test_a_url_never_shows_its_user_part() -> None:
    assert without_userinfo("amqps://user:s3cret@host:5671/path") == "amqps://host:5671/path"
    assert without_userinfo(["https://a:b@h/q", "plain"]) == ["https://h/q", "plain"]
    assert without_userinfo("orders@topic") == "orders@topic"


def test_figures_of_dead_triggerers_are_left_out_and_live_ones_summed() -> None:
    published = [
        {
            "carrier_trigger_id": 1,
            "published_at": 10,
            "last_received_at": 9,
            "in_flight": 2,
            "totals": {"received": 5},
            "history": [[10, 5, 0, 2]],
        },
        {
            "carrier_trigger_id": 2,
            "published_at": 12,
            "last_received_at": 11,
            "in_flight": 1,
            "totals": {"received": 7},
            "history": [[12, 7, 0, 1]],
        },
        {
            "carrier_trigger_id": 3,
            "published_at": 1,
            "last_received_at": 1,
            "in_flight": 9,
            "totals": {"received": 100},
            "history": [],
        },
    ]
    running = {1: 101, 2: 102, 3: 103}
    merged = merge_figures(published, running, alive={101, 102})
    assert merged is not None
    assert merged["totals"] == {"received": 12}
    assert merged["in_flight"] == 3
    assert merged["published_at"] == 12
    assert merged["last_received_at"] == 11
    assert merge_figures(published, running, alive=set()) is None


def test_a_dead_triggerers_last_figures_never_count_once_its_carrier_runs_elsewhere() -> None:
    """Issue 45 item 12: a dead triggerer's carrier (2) runs on triggerer 8, which wrote since."""
    dead = {"carrier_trigger_id": 2, "published_at": 50, "in_flight": 20}
    dead |= {"totals": {"received": 20}, "history": []}
    live = {"carrier_trigger_id": 1, "published_at": 60, "in_flight": 0}
    live |= {"totals": {"received": 20}, "history": []}
    merged = merge_figures([dead, live], running={1: 8, 2: 8}, alive={8})
    assert merged is not None
    assert (merged["totals"], merged["in_flight"]) == ({"received": 20}, 0)
    assert merge_figures([dead, live], running={1: 8, 2: 7}, alive={8}) == merged  # 2 not moved yet


def test_one_triggerer_counts_once_when_its_carrier_changed() -> None:
    """A watcher with a lower trigger id joined: the triggerer writes a new key, the old one stays."""
    old = {"carrier_trigger_id": 5, "published_at": 10, "in_flight": 3}
    old |= {"totals": {"received": 10}, "history": []}
    new = {"carrier_trigger_id": 4, "published_at": 20, "in_flight": 1}
    new |= {"totals": {"received": 12}, "history": []}
    merged = merge_figures([old, new], running={4: 8, 5: 8}, alive={8})
    assert merged is not None
    assert (merged["totals"], merged["in_flight"]) == ({"received": 12}, 1)


def test_kafka_lag_of_two_triggerers_is_each_ones_partitions_together() -> None:
    def published(carrier: int, lag: dict[str, dict[str, int]]) -> dict[str, object]:
        return {
            "carrier_trigger_id": carrier,
            "published_at": 1,
            "totals": {},
            "history": [],
            "lag": lag,
        }

    merged = merge_figures(
        [
            published(1, {"trigger 1": {"orders/0": 4}, "trigger 2": {"orders/0": 0}}),
            published(2, {"trigger 1": {"orders/1": 7}}),
            published(3, {"trigger 1": {"orders/2": 99}}),  # no live triggerer runs it
        ],
        running={1: 101, 2: 102, 3: 103},
        alive={101, 102},
    )
    assert merged is not None
    assert merged["lag"] == {"trigger 1": {"orders/0": 4, "orders/1": 7}, "trigger 2": {"orders/0": 0}}


def _stream(triggerers: list[int | None], every_triggerer_reads_everything: bool = False) -> Stream:
    (stream,) = group_streams([(i, SQS, {"queue_url": QUEUE}, t) for i, t in enumerate(triggerers, start=1)])
    stream.every_triggerer_reads_everything = every_triggerer_reads_everything
    return stream


class _Job:
    hostname = "host"


def test_a_leased_queue_split_across_triggerers_is_a_warning() -> None:
    stream = _stream([1, 2])
    _finish(stream, {1: _Job(), 2: _Job()}, {1, 2}, {}, {}, {}, NOW)
    assert [w["kind"] for w in stream.warnings] == ["split"]
    assert stream.state == "warning"


def test_a_watcher_no_live_triggerer_runs_is_reported() -> None:
    stream = _stream([1, None])
    _finish(stream, {1: _Job()}, {1}, {}, {}, {}, NOW)
    assert [w["kind"] for w in stream.warnings] == ["unassigned"]
    assert stream.state == "warning"
    down = _stream([None])
    _finish(down, {}, set(), {}, {}, {}, NOW)
    assert down.state == "down"


def test_messages_in_flight_with_no_figure_moving_is_a_stuck_stream() -> None:
    stream = _stream([1])
    stale = NOW.timestamp() - 600
    figures = {
        figures_stream_id(stream._key): [
            {
                "carrier_trigger_id": 1,
                "published_at": stale,
                "last_received_at": stale,
                "in_flight": 4,
                "totals": {"received": 4},
                "history": [],
            }
        ]
    }
    _finish(stream, {1: _Job()}, {1}, figures, {}, {}, NOW)
    assert [w["kind"] for w in stream.warnings] == ["stuck"]


def test_a_stream_is_ok_while_it_receives_and_idle_ten_minutes_after() -> None:
    def state(last_received: float) -> str:
        stream = _stream([1])
        value = {
            "carrier_trigger_id": 1,
            "published_at": last_received,
            "last_received_at": last_received,
            "in_flight": 0,
            "totals": {"received": 1},
            "history": [],
        }
        _finish(stream, {1: _Job()}, {1}, {figures_stream_id(stream._key): [value]}, {}, {}, NOW)
        return stream.state

    assert state(NOW.timestamp() - 30) == "ok"
    assert state(NOW.timestamp() - 900) == "idle"


def test_two_streams_with_one_label_each_show_their_own_figures() -> None:
    """Issue 45 item 13: queue ``orders`` in two accounts: one label, two streams, two sets of figures."""
    other = QUEUE.replace("000000000000", "111111111111")
    east, west = sorted(
        group_streams([(1, SQS, {"queue_url": QUEUE}, 1), (2, SQS, {"queue_url": other}, 1)]),
        key=lambda s: s.watchers[0].trigger_id,
    )
    assert east.label == west.label

    def value(stream: Stream, received: int) -> dict[str, object]:
        carrier = stream.watchers[0].trigger_id
        return {"carrier_trigger_id": carrier, "triggerer_job_id": 1, "published_at": NOW.timestamp()} | {
            "in_flight": 0,
            "totals": {"received": received},
            "history": [],
        }

    published = {
        figures_stream_id(east._key): [value(east, 25)],
        figures_stream_id(west._key): [value(west, 3)],
    }
    for stream in (east, west):
        _finish(stream, {1: _Job()}, {1}, published, {}, {}, NOW)
    assert east.figures is not None
    assert west.figures is not None
    assert (east.figures["totals"], west.figures["totals"]) == ({"received": 25}, {"received": 3})
