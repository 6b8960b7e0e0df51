from __future__ import annotations

import pytest
from airflow.triggers.shared_stream import AdvanceItem, AdvanceOutcome

from airflow_shared_stream.common.settlement import Settlement, decide, describe_batch, split_by_settlement


@pytest.mark.parametrize(
    ("acked", "failed", "rejected", "expected"),
    [
        (1, 0, 0, Settlement.ACK),
        (5, 0, 0, Settlement.ACK),
        (0, 1, 0, Settlement.REDELIVER),
        (3, 1, 0, Settlement.REDELIVER),
        (3, 1, 2, Settlement.REDELIVER),  # a failure wins over a reject
        (0, 2, 1, Settlement.REDELIVER),
        (0, 0, 1, Settlement.DEAD_LETTER),
        (4, 0, 1, Settlement.DEAD_LETTER),  # one reject dead-letters what others acked
        (0, 0, 0, Settlement.REDELIVER),  # nobody was online at fan-out
    ],
)
def test_decision_table(acked, failed, rejected, expected):
    assert decide(AdvanceOutcome(acked=acked, failed=failed, rejected=rejected)) is expected


def test_ack_exactly_when_airflow_calls_the_outcome_clean():
    for acked in range(3):
        for failed in range(3):
            for rejected in range(3):
                outcome = AdvanceOutcome(acked=acked, failed=failed, rejected=rejected)
                assert (decide(outcome) is Settlement.ACK) == outcome.is_clean


def test_split_keeps_fan_out_order_within_each_settlement():
    batch = [
        AdvanceItem("a", AdvanceOutcome(1, 0)),
        AdvanceItem("b", AdvanceOutcome(0, 1)),
        AdvanceItem("c", AdvanceOutcome(1, 0)),
        AdvanceItem("d", AdvanceOutcome(0, 0, 1)),
        AdvanceItem("e", AdvanceOutcome(0, 0)),
    ]
    assert split_by_settlement(batch) == {
        Settlement.ACK: ["a", "c"],
        Settlement.REDELIVER: ["b", "e"],
        Settlement.DEAD_LETTER: ["d"],
    }
    assert describe_batch(batch) == {"ack": 2, "redeliver": 2, "dead_letter": 1}
