"""The reliability scenarios' own bookkeeping (tests/reliability/scenarios.py): pure logic."""

from __future__ import annotations

import json
import random

from tests.reliability.scenarios import Result, WatcherResult, in_flight, make_bodies
from tests.reliability.triggerer import BOUND, PERSISTED


def test_exactly_one_percent_poison_and_at_least_one():
    bodies, poison = make_bodies(2000, random.Random(1))
    assert len(poison) == 20
    assert {b["n"] for b in bodies if b["poison"]} == poison
    assert len(make_bodies(10, random.Random(1))[1]) == 1


def test_in_flight_counts_messages_bound_and_never_persisted_in_that_incarnation(tmp_path):
    def line(i, w, n, seq):
        return json.dumps({"i": i, "w": w, "n": n, "seq": seq}) + "\n"

    bound = [line(1, "all", 1, 1), line(1, "even", 2, 2), line(1, "all", 2, 3), line(2, "all", 3, 1)]
    (tmp_path / BOUND).write_text("".join(bound) + '{"i": 1, "w": "all", "n"')  # cut by the kill
    (tmp_path / PERSISTED).write_text(line(1, "all", 1, 1) + line(2, "all", 3, 1))
    assert in_flight(tmp_path, 1) == 1  # message 2: two events bound, none persisted
    assert in_flight(tmp_path, 2) == 0


def test_a_run_fails_on_loss_wrong_dead_letters_or_a_kill_or_outage_with_nothing_in_flight():
    ok = Result("sqs", "sigkill", produced=100, poison=1, dead_lettered=1, finished=True, left_on_broker=0)
    ok.watchers["all"] = WatcherResult(expected=99, persisted_distinct=99, persisted_events=120, lost=0)
    ok.in_flight_at_kills = [12]
    assert ok.problems() == []
    assert ok.duplicates == 21
    lost = Result("sqs", "x", produced=100, poison=1, dead_lettered=1, finished=True)
    lost.watchers["all"] = WatcherResult(expected=99, persisted_distinct=98, persisted_events=98, lost=1)
    assert any("lost" in p for p in lost.problems())
    idle_kill = Result("sqs", "x", produced=1, poison=1, dead_lettered=1, finished=True)
    idle_kill.in_flight_at_kills = [3, 0]
    assert any("nothing in flight" in p for p in idle_kill.problems())
    idle_outage = Result("pubsub", "broker_restart", produced=1, poison=1, dead_lettered=1, finished=True)
    idle_outage.in_flight_at_outage = 0
    assert idle_outage.problems() == ["the broker outage landed with nothing in flight"]
    idle_outage.in_flight_at_outage = 40
    assert idle_outage.problems() == []
    wrong = Result("sqs", "x", produced=1, poison=1, dead_lettered=0, wrongly_dead_lettered=1, finished=True)
    assert len(wrong.problems()) == 2
    hung = Result("sqs", "x", produced=1, poison=1, dead_lettered=1, finished=True)
    hung.watchers["hang"] = WatcherResult(expected=99, persisted_distinct=0, persisted_events=0, lost=99)
    assert hung.problems() == []  # Airflow fails a hung watcher (core limit 4): not a loss
