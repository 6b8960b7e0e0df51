"""The per-partition commit ledger: cumulative commits that never pass a held offset."""

from __future__ import annotations

import random

from airflow_shared_stream.common.settlement import Settlement
from airflow_shared_stream.kafka.offsets import LaneAction, OffsetLedger

ACK, RE, DLQ = Settlement.ACK, Settlement.REDELIVER, Settlement.DEAD_LETTER
LANE = ("t", 0)


def test_all_acked_commits_past_last():
    ledger = OffsetLedger()
    assert ledger.settle(LANE, [(0, ACK), (1, ACK), (2, DLQ)]) == LaneAction(commit=3, seek=None)
    assert ledger.settle(LANE, [(3, ACK)]) == LaneAction(commit=4, seek=None)


def test_redeliver_holds_floor_and_seeks_back():
    ledger = OffsetLedger()
    action = ledger.settle(LANE, [(0, ACK), (1, ACK), (2, RE), (3, ACK)])
    assert action == LaneAction(commit=2, seek=2)
    assert ledger.floor(LANE) == 2
    # Messages read before the seek still arrive: nothing past the floor is committed.
    assert ledger.settle(LANE, [(4, ACK), (5, ACK)]) == LaneAction(commit=None, seek=None)
    # The re-read floor offset settles: the floor lifts and commits resume.
    assert ledger.settle(LANE, [(2, ACK), (3, ACK), (4, ACK)]) == LaneAction(commit=5, seek=None)
    assert ledger.floor(LANE) is None


def test_floor_lifts_when_reread_floor_is_inside_a_batch_starting_above_it():
    # The stale pre-seek messages and the re-read ones can arrive in one batch; Airflow's own
    # producer keys the lift on the batch's first offset and would stall here forever.
    ledger = OffsetLedger()
    assert ledger.settle(LANE, [(0, RE)]) == LaneAction(commit=None, seek=0)
    action = ledger.settle(LANE, [(1, ACK), (2, ACK), (0, ACK), (1, ACK)])
    assert action == LaneAction(commit=2, seek=None)
    assert ledger.settle(LANE, [(2, ACK), (3, ACK)]) == LaneAction(commit=4, seek=None)


def test_lowest_hold_wins_and_later_hold_cannot_raise_it():
    ledger = OffsetLedger()
    assert ledger.settle(LANE, [(5, RE)]).seek == 5
    # Offsets below the floor were never committed in this lane: committing up to it is safe.
    assert ledger.settle(LANE, [(6, ACK), (7, RE)]) == LaneAction(commit=5, seek=5)
    assert ledger.floor(LANE) == 5
    assert ledger.settle(LANE, [(8, ACK)]) == LaneAction(commit=None, seek=None)


def test_hold_again_on_reread():
    ledger = OffsetLedger()
    ledger.settle(LANE, [(0, ACK), (1, RE)])
    assert ledger.settle(LANE, [(1, RE)]) == LaneAction(commit=None, seek=1)
    assert ledger.settle(LANE, [(1, ACK)]) == LaneAction(commit=2, seek=None)


def test_commit_never_goes_backwards():
    ledger = OffsetLedger()
    assert ledger.settle(LANE, [(0, ACK), (1, ACK), (2, ACK)]).commit == 3
    # A duplicate of an older message (re-read after a rebalance of a sibling lane) settles late.
    assert ledger.settle(LANE, [(1, ACK)]).commit is None
    assert ledger.committed(LANE) == 3


def test_lanes_are_independent():
    ledger = OffsetLedger()
    other = ("t", 1)
    ledger.settle(LANE, [(0, RE)])
    assert ledger.settle(other, [(0, ACK), (1, ACK)]).commit == 2
    assert ledger.floor(LANE) == 0


def test_settle_acks_commits_as_settle_would():
    # The fold's fast path for batches of ACKs only must leave the ledger exactly as settle does,
    # held floors included: random batches, mixed and ACK-only, applied to two ledgers.
    rng = random.Random(7)
    general, fast = OffsetLedger(), OffsetLedger()
    for _ in range(2_000):
        offsets = [rng.randrange(40) for _ in range(rng.randrange(1, 6))]
        if rng.random() < 0.3:
            items = [(offset, rng.choice([ACK, RE, DLQ])) for offset in offsets]
            assert fast.settle(LANE, items) == general.settle(LANE, items)
        else:
            expected = general.settle(LANE, [(offset, ACK) for offset in offsets])
            assert fast.settle_acks(LANE, offsets) == expected.commit
            assert expected.seek is None
        assert fast.floor(LANE) == general.floor(LANE)
        assert fast.committed(LANE) == general.committed(LANE)


def test_settle_acks_lifts_the_floor_it_settles():
    ledger = OffsetLedger()
    assert ledger.settle(LANE, [(0, ACK), (1, RE)]) == LaneAction(commit=1, seek=1)
    assert ledger.settle_acks(LANE, [2, 3]) is None  # read before the seek: the floor holds
    assert ledger.settle_acks(LANE, [1, 2]) == 3
    assert ledger.floor(LANE) is None
    assert ledger.settle_acks(LANE, []) is None
