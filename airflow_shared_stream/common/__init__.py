"""Broker-independent parts every shared-stream producer and trigger is built from."""

from __future__ import annotations

from airflow_shared_stream.common.flow_control import CreditWindow
from airflow_shared_stream.common.leases import LeaseKeeper
from airflow_shared_stream.common.matching import EnvelopeMatcher, Verdict
from airflow_shared_stream.common.settlement import Settlement, decide, split_by_settlement

__all__ = [
    "CreditWindow",
    "EnvelopeMatcher",
    "LeaseKeeper",
    "Settlement",
    "Verdict",
    "decide",
    "split_by_settlement",
]
