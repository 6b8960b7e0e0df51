"""
A realistic stream of order events, and what the example pipelines must make of each one.

The e2e tests and the demo publish the same kind of stream, so the demo's summary and the
tests' assertions rest on one definition. :func:`expected_assets` and :func:`expected_row`
restate the example Dags' rules (``example_dags/order_pipeline.py``) independently, so a change
to one side that the other does not share fails the e2e suite.
"""

from __future__ import annotations

import random
import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any

LARGE_ORDER_AMOUNT = 500
CURRENCIES = ("EUR", "USD", "GBP")


def order_stream(count: int, *, tag: str, seed: int = 7, now: datetime | None = None) -> list[dict[str, Any]]:
    """
    ``count`` order events over the last three days, mostly ``order_created``.

    Mixed in, deterministically for a seed: cancellations, large orders (matched by two
    watchers), ``order_shipped`` events that no watcher matches, events without an
    ``order_id`` (rejected to the dead-letter path) and events with a non-positive amount
    (turned into asset events, dropped by the Spark job's validation).

    :param tag: prefix of every ``event_id``, so a test can pick out its own events.
    """
    rng = random.Random(seed)
    now = now or datetime.now(timezone.utc)
    events = []
    for i in range(count):
        roll = rng.random()
        event_type = "order_created"
        if roll < 0.2:
            event_type = "order_cancelled"
        elif roll < 0.28:
            event_type = "order_shipped"
        amount = round(rng.uniform(5, 1200) if rng.random() < 0.25 else rng.uniform(5, 300), 2)
        event: dict[str, Any] = {
            "event_id": f"{tag}-{i:05d}-{uuid.UUID(int=rng.getrandbits(128)).hex[:8]}",
            "type": event_type,
            "order_id": f"o-{rng.randrange(10_000, 99_999)}",
            "customer_id": f"c-{rng.randrange(1, 400)}",
            "amount": amount,
            "currency": rng.choice(CURRENCIES),
            "occurred_at": (now - timedelta(seconds=rng.randrange(0, 3 * 86400))).strftime(
                "%Y-%m-%dT%H:%M:%SZ"
            ),
        }
        if i % 11 == 5:
            del event["order_id"]  # malformed: dead-lettered by every watcher's reject
        elif i % 13 == 7:
            event["amount"] = 0  # matched, but invalid for the Spark job
        events.append(event)
    return events


def is_rejected(event: dict[str, Any]) -> bool:
    return event.get("order_id") is None or event.get("event_id") is None


def expected_assets(source: str, event: dict[str, Any]) -> set[str]:
    """Names of the assets (of ``source``'s Dag) that get an asset event for ``event``."""
    if is_rejected(event):
        return set()
    names = set()
    if event["type"] == "order_created":
        names.add(f"{source}_orders_created")
        if event["amount"] >= LARGE_ORDER_AMOUNT:
            names.add(f"{source}_large_orders")
    elif event["type"] == "order_cancelled":
        names.add(f"{source}_orders_cancelled")
    return names


def expected_row(event: dict[str, Any]) -> bool:
    """Whether ``event`` ends up as a row of the Parquet ``orders`` table."""
    return bool(expected_assets("x", event)) and event.get("amount", 0) > 0


@dataclass(frozen=True)
class Expectation:
    """What a published batch must produce."""

    asset_events: dict[str, set[str]]
    """asset name -> event ids it must get an asset event for (at least once)."""
    rows: set[str]
    """event ids that must be in the Parquet output, exactly once each."""
    rejected: set[str]
    """event ids that must reach the dead-letter path."""


def expectation(source: str, events: list[dict[str, Any]]) -> Expectation:
    asset_events: dict[str, set[str]] = {}
    for event in events:
        for name in expected_assets(source, event):
            asset_events.setdefault(name, set()).add(event["event_id"])
    return Expectation(
        asset_events=asset_events,
        rows={e["event_id"] for e in events if expected_row(e)},
        rejected={e["event_id"] for e in events if is_rejected(e)},
    )
