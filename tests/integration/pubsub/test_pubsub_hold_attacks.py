"""
Attacks on the hold of Pub/Sub ordering keys no watcher has seen (issue 47 items 4-7), on the
stand-in that redelivers a nacked key as the service documents (tests/support/pubsub_service.py).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest

from airflow_shared_stream.testing import SharedStreamHarness
from tests.integration.contract.broker import DELIVERY_LIMIT
from tests.integration.contract.delivery_budget import GIVE_BACK_LOG
from tests.integration.pubsub.broker import PubSubContractBroker
from tests.support.waiting import eventually

pytestmark = pytest.mark.integration

MANY_DEADLINES_OFFERS = 3 * (DELIVERY_LIMIT + 1)
"""Times each held message reaches nobody while its leases must outlive many ack deadlines."""


async def test_two_interleaved_keys_given_back_keep_their_order_and_spend_one_attempt_per_give_back(
    pubsub_service, caplog
):
    """
    FAULT_MODEL classes 4 and 9. Two ordering keys, interleaved, reach nobody (the only watcher
    is stuck) and are held past the bound (the manager's 2 s ack timeout) more than once: each
    give-back nacks each key whole, in its order. When a watcher is back, each key comes in its
    publish order, and no later message of a key spent more attempts than its key's head
    (a later message nacked again while its head was awaited would spend extra ones).
    """
    broker = PubSubContractBroker(pubsub_service)
    stream = broker.create_stream(max_deliveries=DELIVERY_LIMIT, ordered=True)
    unstick = asyncio.Event()

    async def hang(event: Any) -> None:
        await unstick.wait()

    def given_back() -> int:
        return sum(1 for r in caplog.records if GIVE_BACK_LOG in r.getMessage())

    caplog.set_level(logging.WARNING, logger="airflow_shared_stream")
    async with SharedStreamHarness(confirm_after=0.0, ack_timeout=2.0) as harness:
        try:
            stuck = harness.add(broker.trigger(stream), before_bind=hang)
            broker.publish(stream, [{"k": "z", "n": 0}], lane="z")
            await eventually(
                lambda: harness.manager._groups.get(stuck.key),
                lambda g: g is not None and stuck.trigger_id in g._failed_subscribers,
                timeout=60,
                what="the ack timeout leaving the stuck watcher out of the fan-out",
            )
            unseen: dict[str, str] = {}
            for n in range(3):
                for key in ("a", "b"):
                    [mid] = broker.publish(stream, [{"k": key, "n": n}], lane=key)
                    unseen[mid] = key
            await eventually(given_back, lambda n: n >= 2, timeout=90, what="two give-backs")
            back = harness.add(broker.trigger(stream))
            await eventually(
                lambda: {p["message_id"] for p in back.payloads},
                lambda seen: set(unseen) <= seen,
                timeout=60,
                what="both keys seen",
            )
        finally:
            unstick.set()
    first_seen: dict[str, list[int]] = {"a": [], "b": [], "z": []}
    seen_ids: set[str] = set()
    for p in back.payloads:
        if p["message_id"] in seen_ids:
            continue
        seen_ids.add(p["message_id"])
        first_seen[p["body"]["k"]].append(p["body"]["n"])
    assert first_seen["a"] == [0, 1, 2], first_seen
    assert first_seen["b"] == [0, 1, 2], first_seen
    spent = {}
    for p in back.payloads:
        spent.setdefault(p["message_id"], broker.attempts_spent(p))
    by_key = {key: [spent[m] for m in unseen if unseen[m] == key] for key in ("a", "b")}
    for key, counts in by_key.items():
        assert max(counts) <= counts[0], f"key {key}: a later message spent more than its head: {by_key}"
    assert all(c < DELIVERY_LIMIT for counts in by_key.values() for c in counts), by_key


async def test_an_ordering_key_held_when_its_stream_closes_comes_back_in_order_to_the_next_stream(
    pubsub_service, monkeypatch
):
    """
    FAULT_MODEL classes 4 and 9: a restart while a key is held. The only watcher, stuck, leaves
    while its key's later messages are held unseen; the closing stream nacks what it holds, and
    the next stream gets the key in its publish order, each unseen message having spent at most
    the one attempt of the close.
    """
    from tests.integration.contract.broker import ids
    from tests.integration.contract.delivery_budget import (
        HOLD_OPTION_ENV,
        LONG_HOLD,
        DeliveryBudgetContract,
    )

    monkeypatch.setenv(HOLD_OPTION_ENV, LONG_HOLD)
    broker = PubSubContractBroker(pubsub_service)
    stream = broker.create_stream(max_deliveries=DELIVERY_LIMIT, ordered=True)
    unstick = asyncio.Event()
    async with SharedStreamHarness(confirm_after=0.0, ack_timeout=2.0) as harness:
        try:
            hold = DeliveryBudgetContract()._hold_unseen_behind_a_stuck_watcher
            stuck, unseen = await hold(broker, stream, harness, unstick, lane="g")
            await harness.remove(stuck)
        finally:
            unstick.set()
    async with SharedStreamHarness(confirm_after=0.0) as harness:
        later = harness.add(broker.trigger(stream))
        await later.wait_for_events(3, timeout=90)
        await eventually(lambda: broker.remaining(stream), lambda r: r == 0, timeout=60, what="acked")
    assert set(unseen) <= set(ids(broker, later))
    order = [p["body"]["n"] for p in later.payloads]
    assert order[:3] == [0, 1, 2], f"the key came back out of order: {order}"
    spent = {broker.message_id(p): broker.attempts_spent(p) for p in later.payloads}
    assert all(spent[i] <= 1 for i in unseen), f"attempts spent past the close's one: {spent}"
    assert broker.dead_letters(stream) == []


async def test_a_key_held_on_the_shortest_ack_deadline_spends_no_attempt(pubsub_service, monkeypatch):
    """
    FAULT_MODEL classes 4 and 5: a subscription with the shortest ack deadline Pub/Sub allows
    (10 s). The held key's leases (renewed without the ack-timeout limit while nobody saw them)
    must outlive many deadlines (each held message offered to nobody 18 times, paced up to 5 s:
    over a minute): when a watcher is back, the unseen messages spent no attempt.
    """
    from tests.integration.contract.delivery_budget import HOLD_OPTION_ENV, LONG_HOLD, DeliveryBudgetContract

    monkeypatch.setenv(HOLD_OPTION_ENV, LONG_HOLD)
    broker = PubSubContractBroker(pubsub_service)
    stream = broker.create_stream(max_deliveries=DELIVERY_LIMIT, ordered=True, lease_seconds=10)
    unstick = asyncio.Event()
    async with SharedStreamHarness(confirm_after=0.0, ack_timeout=2.0) as harness:
        try:
            hold = DeliveryBudgetContract()._hold_unseen_behind_a_stuck_watcher
            _, unseen = await hold(
                broker, stream, harness, unstick, lane="g", offers_each=MANY_DEADLINES_OFFERS
            )
            back = harness.add(broker.trigger(stream))
            await back.wait_for_events(3, timeout=60)
            await eventually(lambda: broker.remaining(stream), lambda r: r == 0, timeout=60, what="acked")
        finally:
            unstick.set()
    order = [p["body"]["n"] for p in back.payloads]
    assert order[:3] == [0, 1, 2], order
    spent = {broker.message_id(p): broker.attempts_spent(p) for p in back.payloads}
    assert [spent[i] for i in unseen] == [0, 0], f"attempts spent while nobody saw them: {spent}"
