"""Runs of consecutive delivery ids: what one range disposition may settle (servicebus/ranges.py)."""

from __future__ import annotations

import random

from airflow_shared_stream.servicebus.ranges import (
    MIN_OUTCOME_TIMEOUT_SECONDS,
    MIN_RUN,
    outcome_timeout,
    split_runs,
)


def _split(ids: list[int]) -> tuple[list[list[int]], list[int]]:
    return split_runs(ids, lambda delivery_id: delivery_id)


def test_consecutive_ids_are_one_run_in_order_whatever_the_order_given():
    assert _split([7, 5, 6, 4]) == ([[4, 5, 6, 7]], [])


def test_a_gap_ends_a_run_and_a_lone_id_is_left_alone():
    assert _split([1, 2, 3, 5, 7, 8]) == ([[1, 2, 3], [7, 8]], [5])


def test_nothing_shorter_than_a_run_is_a_run():
    assert MIN_RUN == 2
    assert _split([]) == ([], [])
    assert _split([3]) == ([], [3])
    assert _split([1, 3, 5]) == ([], [1, 3, 5])


def test_a_repeated_id_ends_the_run_instead_of_joining_it():
    # It cannot happen on one link: the repeat starts a run of its own, it does not stretch one.
    assert _split([1, 2, 2, 3]) == ([[1, 2], [2, 3]], [])


def test_a_run_does_not_cross_the_32_bit_wrap():
    top = 2**32 - 1
    assert _split([top - 1, top, 0, 1]) == ([[0, 1], [top - 1, top]], [])


def test_every_id_is_kept_exactly_once_and_every_run_is_consecutive():
    rng = random.Random(7)
    for _ in range(500):
        ids = rng.sample(range(60), rng.randint(0, 40))
        runs, rest = _split(ids)
        assert sorted([*(i for run in runs for i in run), *rest]) == sorted(ids)
        for run in runs:
            assert len(run) >= MIN_RUN
            assert run == list(range(run[0], run[0] + len(run)))
        for lone in rest:  # a leftover id has no neighbour among the ids given
            assert lone - 1 not in ids
            assert lone + 1 not in ids


def test_a_range_outcome_is_awaited_for_a_third_of_its_shortest_lock_at_most():
    # The rest of the lock is left to complete the messages one by one if it never comes.
    assert outcome_timeout(30.0, 60.0) == 10.0
    assert outcome_timeout(300.0, 60.0) == 60.0  # never longer than the SDK's own timeout
    assert outcome_timeout(0.3, 60.0) == MIN_OUTCOME_TIMEOUT_SECONDS
    assert outcome_timeout(None, 60.0) == 60.0  # no lock expiry known: the SDK's timeout
