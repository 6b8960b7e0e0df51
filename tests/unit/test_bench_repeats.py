"""``bench/watchers.py``: which repeat a table row shows, and what its note says."""

from __future__ import annotations

from bench.machine import Settled
from bench.watchers import Cell, _note, median_cell


def cell(rate: float) -> Cell:
    return Cell("kafka", "ours", 1, 1000, delivered=int(rate), seconds=1.0)


def test_the_median_repeat_is_kept_with_every_repeats_rate():
    chosen = median_cell([cell(300), cell(100), cell(200)])
    assert chosen.messages_per_second == 200
    assert chosen.repeats == [300.0, 100.0, 200.0]  # in the order they ran
    assert _note(chosen) == "repeats: 300 / 100 / 200"


def test_an_even_count_keeps_the_lower_middle_and_one_run_has_no_note():
    assert median_cell([cell(400), cell(100), cell(300), cell(200)]).messages_per_second == 200
    single = median_cell([cell(500)])
    assert single.repeats == []
    assert _note(single) == ""


def test_a_broker_slow_to_go_quiet_is_noted_and_one_still_busy_says_so():
    quick = cell(100)
    quick.settled = Settled(0.3, 0.01, idle=True)
    assert _note(quick) == ""
    slow = cell(100)
    slow.settled = Settled(12.4, 0.02, idle=True)
    assert _note(slow) == "the broker took 12 s to go quiet before it"
    busy = cell(100)
    busy.settled = Settled(60.1, 0.73, idle=False)
    assert _note(busy) == "the broker was still busy (73% of a core) after 60 s"
