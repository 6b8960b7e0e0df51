"""
The settlement decision: one table, four brokers.

Airflow's shared-stream manager reports, per raw event, how the subscribers that were online at
fan-out resolved it (:class:`~airflow.triggers.shared_stream.AdvanceOutcome`). Turning those
counts into a broker action is the single place where a producer could lose or duplicate a
message, so the decision lives here, once, and every broker maps the three answers to its own
API calls.

========================================  ============
outcome                                   decision
========================================  ============
acked > 0, failed = 0, rejected = 0       ACK
failed > 0 (whatever else)                REDELIVER
rejected > 0, failed = 0                  DEAD_LETTER
all zero (nobody was subscribed)          REDELIVER
========================================  ============

A failure wins over a reject because a failed subscriber never got to look at the message: it
must see it again, and a redelivery gives the rejecting subscriber another chance to reject it.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Sequence
from typing import Any

from airflow.triggers.shared_stream import AdvanceItem, AdvanceOutcome


class Settlement(enum.Enum):
    """What the broker must do with one fully resolved message."""

    ACK = "ack"
    REDELIVER = "redeliver"
    DEAD_LETTER = "dead_letter"

    # Members are singletons, so identity is a valid hash; Enum's own hashes the member's name
    # in Python, and every advance builds and reads a dict keyed by settlement.
    __hash__ = object.__hash__


def decide(outcome: AdvanceOutcome) -> Settlement:
    """Map one message's resolution counts to its settlement (see the module table)."""
    if outcome.failed > 0:
        return Settlement.REDELIVER
    if outcome.rejected > 0:
        return Settlement.DEAD_LETTER
    if outcome.acked > 0:
        return Settlement.ACK
    return Settlement.REDELIVER


def split_by_settlement(batch: Iterable[AdvanceItem]) -> dict[Settlement, list[Any]]:
    """
    Group a batch's broker payloads by settlement, keeping fan-out order inside each group.

    For a producer of its own (outside the leased-queue template) whose broker has batch calls:
    one call per group instead of one per message.
    """
    groups: dict[Settlement, list[Any]] = {settlement: [] for settlement in Settlement}
    for item in batch:
        groups[decide(item.outcome)].append(item.broker_payload)
    return groups


def describe_batch(batch: Sequence[AdvanceItem]) -> dict[str, int]:
    """Count a batch per settlement, for one structured log line per advance."""
    counts = {settlement.value: 0 for settlement in Settlement}
    for item in batch:
        counts[decide(item.outcome).value] += 1
    return counts
