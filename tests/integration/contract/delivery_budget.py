"""A message no watcher has seen spends no broker delivery attempt (:class:`DeliveryBudgetContract`)."""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import Sequence
from typing import Any

import pytest
from airflow.triggers.shared_stream import AdvanceItem

from airflow_shared_stream.testing import SharedStreamHarness, Watcher
from tests.integration.contract.broker import DELIVERY_LIMIT, NOBODY, ContractBroker, ids
from tests.support.waiting import eventually

pytestmark = pytest.mark.integration

ACK_TIMEOUT_ENV = "AIRFLOW__TRIGGERER__SHARED_STREAM_ACK_TIMEOUT"
HOLD_OPTION_ENV = "AIRFLOW__SHARED_STREAM__UNSEEN_HOLD_SECONDS"
"""``[shared_stream] unseen_hold_seconds``, which bounds how long a message nobody saw is held."""
LONG_HOLD = "600"
"""A hold bound no test here reaches: the tests that count offers hold messages past the ack timeout."""
GIVE_BACK_LOG = "no watcher has seen in"

CLOSE_LEASE_SECONDS = 120
"""Far longer than the next stream waits: a message that only comes back when its lease runs
out fails the close test."""


class DeliveryBudgetContract:
    """
    A message no watcher has seen never spends a broker delivery attempt.

    A stuck watcher stays subscribed, but once the ack timeout failed it the manager leaves it
    out of the fan-out: every new message reaches nobody (an all-zero outcome). Given back each
    time, such a message came straight back and spent one of the broker's delivery attempts per
    round, and the broker dead-lettered it within a minute, unseen. Each broker runs these with
    its own delivery limit set low (:data:`DELIVERY_LIMIT`).
    """

    async def _hold_unseen_behind_a_stuck_watcher(
        self,
        broker: ContractBroker,
        stream: Any,
        harness: SharedStreamHarness,
        unstick: asyncio.Event,
        lane: str | None = None,
        offers_each: int = DELIVERY_LIMIT + 1,
    ) -> tuple[Watcher, list[str]]:
        """
        Get a watcher stuck, publish two messages and wait until every message the stream held
        unseen has reached nobody ``offers_each`` times (by default one more than the broker's
        limit allows deliveries); return the stuck watcher and their ids.
        """

        async def hang(event: Any) -> None:
            await unstick.wait()

        trigger = broker.trigger(stream)
        producer_class = trigger.producer_class
        advance = producer_class.advance
        reached_nobody: Counter[str] = Counter()

        async def counted(self: Any, batch: Sequence[AdvanceItem]) -> None:
            # Read before the advance: an ACK replaces a delivery's message (none is counted here).
            reached_nobody.update(
                broker.message_id(item.broker_payload.delivery.message.envelope)
                for item in batch
                if item.outcome == NOBODY
            )
            await advance(self, batch)

        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(producer_class, "advance", counted)
            stuck = harness.add(trigger, before_bind=hang)
            # The watcher sees this one and hangs on it.
            [first] = broker.publish(stream, [{"n": 0}], lane=lane)
            await eventually(
                lambda: harness.manager._groups.get(stuck.key),
                lambda g: g is not None and stuck.trigger_id in g._failed_subscribers,
                timeout=60,
                what="the ack timeout leaving the stuck watcher out of the fan-out",
            )
            # The stuck one's redelivery comes back to nobody first. (On a broker that does not
            # lock a lane, Pub/Sub, a later message of its key handed out before that redelivery
            # comes back with it and counts one attempt: the cost of the watcher's failure,
            # docs/pubsub.rst.)
            await eventually(
                lambda: reached_nobody[first],
                lambda n: n > 0,
                timeout=60,
                what="the stuck watcher's message offered to nobody",
            )
            unseen = broker.publish(stream, [{"n": 1}, {"n": 2}], lane=lane)
            dead: list[Any] = []

            def offers_and_dead_letters() -> tuple[dict[str, int], int]:
                dead.extend(broker.dead_letters(stream))
                return dict(reached_nobody), len(dead)

            # Every message held unseen (the stuck one's, and the later ones once a receive
            # brought them) reaches nobody more often than the broker allows deliveries, or the
            # broker dead-letters one first. Counted per message: while one is held no receive
            # starts, so a round may offer the stuck one's alone.
            await eventually(
                offers_and_dead_letters,
                lambda seen: seen[1] > 0 or min(seen[0].values()) >= offers_each,
                timeout=180,
                what="every message held unseen offered to nobody past the delivery limit",
            )
        assert not dead, f"the broker dead-lettered messages no watcher saw: {dead}"
        return stuck, unseen

    async def test_a_stuck_watcher_spends_no_delivery_attempt_of_messages_nobody_saw(
        self, contract_broker, monkeypatch
    ):
        """
        Held for as long as ``[shared_stream] unseen_hold_seconds`` says, far past the ack
        timeout (the triggerer's setting here is the manager's 2 s), leases renewed meanwhile:
        the broker's shortest lease, so the hold spans several of its terms.
        """
        monkeypatch.setenv(ACK_TIMEOUT_ENV, "2.0")
        monkeypatch.setenv(HOLD_OPTION_ENV, LONG_HOLD)
        broker = contract_broker
        stream = broker.create_stream(max_deliveries=DELIVERY_LIMIT, lease_seconds=broker.lease_seconds_min)
        unstick = asyncio.Event()
        async with SharedStreamHarness(confirm_after=0.0, ack_timeout=2.0) as harness:
            try:
                _, unseen = await self._hold_unseen_behind_a_stuck_watcher(broker, stream, harness, unstick)
                back = harness.add(broker.trigger(stream))  # a watcher is back: it sees them all
                await back.wait_for_events(3, timeout=60)
                await eventually(lambda: broker.remaining(stream), lambda r: r == 0, timeout=60, what="acked")
            finally:
                unstick.set()
        assert set(unseen) <= set(ids(broker, back))
        spent = {broker.message_id(p): broker.attempts_spent(p) for p in back.payloads}
        assert [spent[i] for i in unseen] == [0, 0], f"delivery attempts spent while nobody saw them: {spent}"
        assert broker.dead_letters(stream) == []

    async def test_a_stream_whose_watchers_all_left_gives_back_what_nobody_saw(
        self, contract_broker, monkeypatch
    ):
        monkeypatch.setenv(HOLD_OPTION_ENV, LONG_HOLD)
        broker = contract_broker
        stream = broker.create_stream(max_deliveries=DELIVERY_LIMIT, lease_seconds=broker.lease_seconds_min)
        unstick = asyncio.Event()
        async with SharedStreamHarness(confirm_after=0.0, ack_timeout=2.0) as harness:
            try:
                hold = self._hold_unseen_behind_a_stuck_watcher
                stuck, unseen = await hold(broker, stream, harness, unstick)
                await harness.remove(stuck)  # the only watcher leaves: the stream closes
                assert stuck.key not in harness.manager._groups
            finally:
                unstick.set()
        async with SharedStreamHarness(confirm_after=0.0) as harness:
            later = harness.add(broker.trigger(stream))
            await later.wait_for_events(3, timeout=90)
            await eventually(lambda: broker.remaining(stream), lambda r: r == 0, timeout=60, what="acked")
        assert set(unseen) <= set(ids(broker, later))
        budget = 1 if broker.give_back_spends_attempt else 0  # the one give-back as the stream closed
        spent = {broker.message_id(p): broker.attempts_spent(p) for p in later.payloads}
        assert all(spent[i] <= budget for i in unseen), f"attempts spent past {budget}: {spent}"
        assert broker.dead_letters(stream) == []

    async def test_a_message_held_past_the_managers_ack_timeout_goes_back_as_the_broker_counts_it(
        self, contract_broker, caplog
    ):
        """
        The hold bound, unset, is the ack timeout the manager itself was given (the harness's, as
        a triggerer's is ``[triggerer] shared_stream_ack_timeout``): a message nobody saw is given
        back past it, and the broker counts that give-back as it documents (SQS, Pub/Sub: one
        attempt; Service Bus: none, AMQP ``released``), never enough to dead-letter it.
        """
        broker = contract_broker
        stream = broker.create_stream(max_deliveries=DELIVERY_LIMIT)
        unstick = asyncio.Event()

        async def hang(event: Any) -> None:
            await unstick.wait()

        def given_back() -> int:
            return sum(1 for r in caplog.records if GIVE_BACK_LOG in r.getMessage())

        caplog.set_level(logging.WARNING, logger="airflow_shared_stream")
        async with SharedStreamHarness(confirm_after=0.0, ack_timeout=2.0) as harness:
            try:
                stuck = harness.add(broker.trigger(stream), before_bind=hang)
                broker.publish(stream, [{"n": 0}])
                await eventually(
                    lambda: harness.manager._groups.get(stuck.key),
                    lambda g: g is not None and stuck.trigger_id in g._failed_subscribers,
                    timeout=60,
                    what="the ack timeout leaving the stuck watcher out of the fan-out",
                )
                unseen = broker.publish(stream, [{"n": 1}])
                await eventually(given_back, lambda n: n > 0, timeout=60, what="the give-back past the bound")
                back = harness.add(broker.trigger(stream))
                await back.wait_for_events(2, timeout=60)
                await eventually(lambda: broker.remaining(stream), lambda r: r == 0, timeout=60, what="acked")
            finally:
                unstick.set()
        spent = {broker.message_id(p): broker.attempts_spent(p) for p in back.payloads}
        if broker.give_back_spends_attempt:
            assert 1 <= spent[unseen[0]] < DELIVERY_LIMIT, f"attempts spent: {spent}"
        else:
            assert spent[unseen[0]] == 0, f"a give-back that should not count was counted: {spent}"
        assert broker.dead_letters(stream) == []

    async def test_a_closing_stream_spends_no_delivery_attempt_of_its_own(self, contract_broker):
        """
        A receive still waiting as the stream closes (the next one is read ahead) would take what
        the close gives back, and the broker would count that delivery too: SQS's long poll, a
        Pub/Sub pull. The close gives back only once the receives returned, so the next stream
        sees the closed stream's one delivery (and its give-back, where that counts) and no more.
        """
        broker = contract_broker
        stream = broker.create_stream(max_deliveries=DELIVERY_LIMIT, lease_seconds=CLOSE_LEASE_SECONDS)
        trigger = broker.trigger(stream)
        producer = type(trigger).create_shared_stream_producer(trigger.serialize()[1])
        broker.publish(stream, [{"n": 1}])
        events = producer.open_stream()
        try:
            await asyncio.wait_for(anext(events), timeout=30)  # the next receive is read ahead
        finally:
            await events.aclose()
            await producer.aclose()
        async with SharedStreamHarness(confirm_after=0.0) as harness:
            later = harness.add(broker.trigger(stream))
            await later.wait_for_events(1, timeout=CLOSE_LEASE_SECONDS / 3)
        budget = 1 if broker.give_back_spends_attempt else 0  # the closed stream's one delivery
        spent = [broker.attempts_spent(payload) for payload in later.payloads]
        assert spent == [budget], f"deliveries counted before this stream's, past the closed one's: {spent}"


class OrderedDeliveryBudgetContract(DeliveryBudgetContract):
    """
    The delivery-budget rule for an ordered lane: held whole, offered again in its order.

    Pub/Sub does not lock an ordering key and redelivers a nacked key at once (FIDELITY.md row
    "Pub/Sub ordering key after a nack"): its suite runs this on the stand-in that does so
    (tests/integration/pubsub/test_pubsub_service_fidelity.py), not on the emulator, which stalls
    a nacked key.
    """

    async def test_an_ordered_lane_nobody_saw_spends_no_delivery_attempt_and_keeps_its_order(
        self, contract_broker, monkeypatch
    ):
        monkeypatch.setenv(HOLD_OPTION_ENV, LONG_HOLD)
        broker = contract_broker
        stream = broker.create_stream(
            max_deliveries=DELIVERY_LIMIT, lease_seconds=broker.lease_seconds_min, ordered=True
        )
        unstick = asyncio.Event()
        async with SharedStreamHarness(confirm_after=0.0, ack_timeout=2.0) as harness:
            try:
                hold = self._hold_unseen_behind_a_stuck_watcher
                _, unseen = await hold(broker, stream, harness, unstick, lane="g")
                back = harness.add(broker.trigger(stream))
                await back.wait_for_events(3, timeout=60)
                await eventually(lambda: broker.remaining(stream), lambda r: r == 0, timeout=60, what="acked")
            finally:
                unstick.set()
        order = [p["body"]["n"] for p in back.payloads]
        assert order == [0, 1, 2], f"the lane came back out of order: {order}"
        spent = {broker.message_id(p): broker.attempts_spent(p) for p in back.payloads}
        assert [spent[i] for i in unseen] == [0, 0], f"delivery attempts spent while nobody saw them: {spent}"
        assert broker.dead_letters(stream) == []
