"""
The Pub/Sub shared stream through an outage: the emulator frozen (SIGSTOP) and resumed (SIGCONT).

The emulator keeps its state in memory only, so it cannot be restarted with its messages; frozen,
it keeps them, and to the stream it is a broker that stopped answering mid-call: every pull,
acknowledge and modify_ack_deadline hangs until its deadline. What the emulator does on resume
(checked by hand before these tests were written): a call still waiting for it is applied before
any ack deadline is expired; a call whose deadline passed while it was frozen is dropped, and the
messages it would have acknowledged or extended come back. The reliability scenario
``broker_restart`` freezes it for 15 s, less than the stream's call deadline (``rpc_timeout``,
30 s); these tests take it past a short ``rpc_timeout`` so the failure path runs in seconds.

Each test resumes the emulator in ``finally``: the emulator is the session's, shared by every
Pub/Sub test.

:meth:`~tests.support.pubsub_emulator.PubSubEmulator.freeze` returns once every thread of the JVM
is stopped: SIGSTOP alone is asynchronous, and ACKs sent in the milliseconds after it were
answered on a loaded machine (test_pubsub_emulator_rig.py).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from typing import Any, ClassVar

import pytest

from airflow_shared_stream.pubsub.producer import PubSubSharedStreamProducer
from airflow_shared_stream.testing import SharedStreamHarness
from tests.integration.pubsub.recording import RecordingProducer, RecordingTrigger, track
from tests.support.pubsub_emulator import PubSubEmulator
from tests.support.waiting import eventually

pytestmark = pytest.mark.integration

RPC_TIMEOUT = 3.0
"""The streams' call deadline here: an outage of a few seconds outlasts it (the default is 30 s)."""


class ShortDeadlineProducer(RecordingProducer):
    """The real producer (recording what the emulator accepted) with a 3 s call deadline."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**{**kwargs, "rpc_timeout": RPC_TIMEOUT})


class ShortDeadlineTrigger(RecordingTrigger):
    producer_class: ClassVar[type[PubSubSharedStreamProducer]] = ShortDeadlineProducer


@contextlib.contextmanager
def frozen(pubsub: PubSubEmulator) -> Iterator[None]:
    pubsub.freeze()
    try:
        yield
    finally:
        pubsub.resume()


def ids_of(watcher: Any) -> list[str]:
    return [p["message_id"] for p in watcher.payloads]


async def test_an_outage_shorter_than_the_call_deadline_loses_nothing(pubsub):
    """
    Frozen past a pull's deadline and the ack deadline, not past the calls' own deadline.

    Persisted while the emulator is frozen: the ACKs go out and hang (nothing is acknowledged
    while it is frozen), the pulls time out and are made again, and on resume the ACKs are
    applied and the stream goes on. (In every run here the emulator applied them before it
    expired a deadline, so nothing came back; a redelivery would be a duplicate, not a failure.)
    """
    topic, subscription = pubsub.topic_with_subscription(ack_deadline_seconds=10)
    ledger = track(subscription, ack_deadline=10)
    async with SharedStreamHarness(confirm_after=0.0) as harness:
        harness.persisting = False
        watcher = harness.add(RecordingTrigger(subscription))
        sent = pubsub.publish(topic, [{"n": i} for i in range(20)])
        await watcher.wait_for_events(20)
        with frozen(pubsub):
            harness.persisting = True  # persisted: their ACKs go into the frozen emulator
            await asyncio.sleep(12)  # past the 10 s pull deadline and the 10 s ack deadline
            assert ledger.acked == set()
        await eventually(
            lambda: ledger.acked, lambda acked: acked == set(sent), timeout=30, what="acknowledged"
        )
        assert watcher.error is None
        assert set(ids_of(watcher)) == set(sent)
        await asyncio.sleep(1)  # a copy redelivered on resume would be persisted and acked by now
    assert await asyncio.to_thread(pubsub.pull, subscription, ack=False) == []


async def test_an_outage_past_the_call_deadline_fails_the_stream_and_loses_nothing(pubsub):
    """
    Frozen past the calls' deadline with messages persisted and messages still in flight.

    The ACKs and lease renewals time out while the emulator is frozen, and the stream fails
    with an error that says the endpoint did not answer (the triggerer then re-runs its
    watchers). On resume the emulator drops the calls whose deadline passed, so the messages
    still in flight, and in every run here the persisted ones too, come back to the re-run
    watcher: duplicates, never a loss, and nothing hangs.
    """
    topic, subscription = pubsub.topic_with_subscription(ack_deadline_seconds=10)
    ledger = track(subscription, ack_deadline=10)
    bound: list[int | None] = []
    async with SharedStreamHarness(
        confirm_after=0.0, on_bound=lambda w, seq, e: bound.append(seq)
    ) as harness:
        harness.persisting = False
        watcher = harness.add(ShortDeadlineTrigger(subscription))
        sent = pubsub.publish(topic, [{"n": i} for i in range(20)])
        await watcher.wait_for_events(20)
        in_flight = set(ids_of(watcher)[10:])
        with frozen(pubsub):
            # Half persisted (their ACKs go out and time out), half still in flight (their
            # renewals time out): the stream raises the failed ACK and fails its watchers.
            harness.confirm([seq for seq in bound[:10] if seq is not None])
            error = await watcher.wait_for_error(timeout=30)
            await asyncio.sleep(max(0.0, 12 - RPC_TIMEOUT))  # past the 10 s ack deadline too
        assert "did not answer" in str(error)
        harness.persisting = True
        restarted = harness.add(ShortDeadlineTrigger(subscription))  # as the triggerer re-runs it
        await eventually(
            lambda: (set(ids_of(restarted)), ledger.acked),
            lambda seen_acked: in_flight <= seen_acked[0] and seen_acked[0] <= seen_acked[1],
            timeout=40,
            what="the messages in flight at the outage, delivered again and acknowledged",
        )
        assert restarted.error is None
        await asyncio.sleep(1)  # any other copy of the resume is persisted and acked by now
    assert set(ledger.acked) <= set(sent)
    assert await asyncio.to_thread(pubsub.pull, subscription, ack=False) == []  # nothing left over
