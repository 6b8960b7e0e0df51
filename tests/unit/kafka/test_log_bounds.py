"""Where a position the log no longer holds reads from (pure logic of :mod:`.log_bounds`)."""

from __future__ import annotations

import logging

import pytest
from aiokafka import TopicPartition

from airflow_shared_stream.kafka.log_bounds import LogBounds, place, place_all

TP = TopicPartition("orders", 0)


@pytest.mark.parametrize(
    ("position", "bounds", "expected"),
    [
        (15, LogBounds(10, 20), 15),  # held: read from it
        (20, LogBounds(10, 20), 20),  # at the end: the next record
        (10, LogBounds(10, 20), 10),  # at the start
        (4, LogBounds(10, 20), 10),  # retention took 4-9
        (25, LogBounds(0, 20), 0),  # past the end: a new log
        (15, None, 15),  # bounds unknown: unchanged
    ],
)
def test_a_position_reads_from_itself_while_the_log_holds_it(position, bounds, expected):
    assert place(TP, position, bounds, whose="w") == expected


def test_retention_says_at_warning_which_offsets_it_took(caplog):
    with caplog.at_level(logging.WARNING):
        assert place(TP, 4, LogBounds(10, 20), whose="watcher w") == 10
    assert "retention deleted offsets 4-9 before watcher w" in caplog.text


def test_a_log_ending_below_a_position_counts_only_without_topic_ids():
    assert place(TP, 25, LogBounds(0, 20), whose="w", end_shows_new_topics=False) == 25


def test_place_all_returns_only_what_moved_and_updates_in_place():
    found = {TP: 4, TopicPartition("orders", 1): 12}
    bounds = {TP: LogBounds(10, 20), TopicPartition("orders", 1): LogBounds(0, 20)}
    assert place_all(found, bounds, whose="w") == {TP: 10}
    assert found == {TP: 10, TopicPartition("orders", 1): 12}
