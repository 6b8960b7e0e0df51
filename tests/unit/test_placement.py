"""Where a stream's watchers run (issue 13): grouping by stream key, and the report."""

from __future__ import annotations

import logging

from airflow_shared_stream.placement import report, stream_placements
from tests.support.statsd import statsd  # noqa: F401 - the fixture

SQS = "airflow_shared_stream.sqs.trigger.SqsSharedStreamTrigger"
KAFKA = "airflow_shared_stream.kafka.trigger.KafkaSharedStreamTrigger"
QUEUE = "https://sqs.us-east-1.amazonaws.com/123456789012/orders"


def _rows():
    return [
        (SQS, {"queue_url": QUEUE, "match": "body.a"}, 7),
        (SQS, {"queue_url": QUEUE, "match": "body.b"}, 7),
        (SQS, {"queue_url": QUEUE, "match": "body.c"}, 9),
        (SQS, {"queue_url": QUEUE.replace("orders", "alone")}, 7),
        (KAFKA, {"topics": ["orders"], "match": "value.a"}, 7),
        (KAFKA, {"topics": ["orders"], "match": "value.b"}, 9),
        ("airflow.providers.standard.triggers.temporal.DateTimeTrigger", {"moment": "x"}, 9),
        (SQS, {"no_such_argument": 1}, 9),  # an older version's kwargs: skipped, never raises
    ]


def test_watchers_are_grouped_by_stream_key_and_triggerer():
    placements = {p.label: p for p in stream_placements(_rows())}
    assert placements.keys() == {"orders", "alone"}  # the Kafka stream is labelled "orders" too
    by_broker = {(p.broker, p.label): p for p in stream_placements(_rows())}
    assert by_broker["sqs", "orders"].watchers == {7: 2, 9: 1}
    assert by_broker["sqs", "orders"].split
    assert not by_broker["sqs", "alone"].split
    assert by_broker["kafka", "orders"].every_triggerer_reads_everything


def test_a_split_leased_queue_is_an_error_naming_it_and_a_gauge(caplog, statsd):  # noqa: F811
    with caplog.at_level(logging.INFO, logger="airflow_shared_stream.placement"):
        report(stream_placements(_rows()), triggerer_id=9)
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1
    assert "sqs stream 'orders' (2 on triggerer 7, 1 on triggerer 9)" in errors[0]
    assert "docs/ha.rst" in errors[0]
    infos = [r.getMessage() for r in caplog.records if r.levelno == logging.INFO]
    assert any("kafka stream 'orders'" in line and "none misses" in line for line in infos)
    lines = statsd.read()
    assert "airflow.shared_stream.sqs.orders.triggerers:2|g" in lines
    assert "airflow.shared_stream.kafka.orders.triggerers:2|g" in lines
    # Streams this triggerer does not run are left to the triggerers that do.
    assert not any(line.startswith("airflow.shared_stream.sqs.alone.") for line in lines)


def test_one_triggerer_is_quiet_but_still_measured(caplog, statsd):  # noqa: F811
    with caplog.at_level(logging.INFO, logger="airflow_shared_stream.placement"):
        report(stream_placements(_rows()), triggerer_id=7)
        report(stream_placements([r for r in _rows() if r[2] == 7]), triggerer_id=7)
    assert "airflow.shared_stream.sqs.alone.triggerers:1|g" in statsd.read()
