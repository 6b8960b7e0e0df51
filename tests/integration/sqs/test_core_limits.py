"""
Limits of Airflow core's shared-stream manager (docs/concepts.rst), shown on a real broker.

These are not bugs of this provider; the tests pin the behaviour the docs describe, and the
mitigation the docs recommend.
"""

from __future__ import annotations

import asyncio

import pytest

from airflow_shared_stream.sqs.trigger import SqsSharedStreamTrigger
from airflow_shared_stream.testing import SharedStreamHarness
from tests.support.waiting import eventually

pytestmark = pytest.mark.integration


async def _restart_with_staggered_watchers(sqs, url, grace: float) -> tuple[set[str], set[str]]:
    sent = set(sqs.send(url, [{"n": i} for i in range(20)]))
    async with SharedStreamHarness(confirm_after=0.0, cohort_grace_period=grace) as harness:
        early = harness.add(SqsSharedStreamTrigger(url))
        if grace:
            await asyncio.sleep(grace / 3)  # re-subscribes late, but within the grace period
        else:
            # re-subscribes late: after the early watcher's first messages were deleted
            await early.wait_for_events(1)
            await eventually(lambda: sum(sqs.depth(url)), lambda n: n < 20, timeout=30, what="a delete")
        late = harness.add(SqsSharedStreamTrigger(url))
        await eventually(lambda: sqs.depth(url), lambda d: d == (0, 0), timeout=30, what="drained")
        await early.wait_for_events(len(sent))
    assert {p["message_id"] for p in early.payloads} == sent
    return sent, {p["message_id"] for p in late.payloads}


async def test_a_watcher_that_rejoins_late_misses_what_the_early_one_advanced(sqs, aws_connection):
    sent, seen_late = await _restart_with_staggered_watchers(sqs, sqs.create_queue(), grace=0.0)
    assert seen_late < sent  # limit 2: the late watcher never sees the messages deleted before it joined


async def test_the_cohort_grace_period_lets_late_watchers_join_before_the_first_message(sqs, aws_connection):
    sent, seen_late = await _restart_with_staggered_watchers(sqs, sqs.create_queue(), grace=3.0)
    assert seen_late == sent


async def test_cancelling_a_watcher_while_it_sits_on_a_message_counts_as_an_ack(sqs, aws_connection):
    """Limit 1: a watcher cancelled between taking an event and binding it never persists it."""
    url = sqs.create_queue()
    on_the_event = asyncio.Event()

    async def sit_on_it(event):
        on_the_event.set()
        await asyncio.Event().wait()  # the runner's log call before binding, held open

    async with SharedStreamHarness(confirm_after=0.0) as harness:
        paused = harness.add(SqsSharedStreamTrigger(url), before_bind=sit_on_it)
        other = harness.add(SqsSharedStreamTrigger(url))
        [message_id] = sqs.send(url, [{"n": 1}])
        await asyncio.wait_for(on_the_event.wait(), 30)
        await harness.remove(paused)  # its Dag paused at that instant
        await other.wait_for_events(1)
        await eventually(lambda: sqs.depth(url), lambda d: d == (0, 0), timeout=30, what="deleted")
    assert paused.events == [], "the cancelled watcher got no event..."
    assert [p["message_id"] for p in other.payloads] == [message_id]  # ...yet the message is gone


async def test_an_ack_timeout_fails_a_hung_watcher_without_cancelling_it(sqs, aws_connection, statsd, caplog):
    """
    Limit 4: the ack timeout fails a watcher stuck on an event, but cannot cancel it; the others
    wait for up to the timeout and then get the message again. The provider surfaces it: a
    warning naming the stream, and the ``watcher_failures`` counter.
    """
    url = sqs.create_queue()

    async def hang(event):
        await asyncio.Event().wait()

    async with SharedStreamHarness(confirm_after=0.0, ack_timeout=2.0) as harness:
        hung = harness.add(SqsSharedStreamTrigger(url), before_bind=hang)
        healthy = harness.add(SqsSharedStreamTrigger(url))
        [message_id] = sqs.send(url, [{"n": 1}])
        await healthy.wait_for_events(2, timeout=30)  # once, then again after the timeout failed it
        await eventually(lambda: sqs.depth(url), lambda d: d == (0, 0), timeout=30, what="deleted")
        assert hung.task is not None
        assert not hung.task.done(), "the ack timeout failed the hung watcher but could not cancel it"
    assert [p["message_id"] for p in healthy.payloads] == [message_id, message_id]
    label = url.rsplit("/", 1)[1]
    assert statsd.counter(f"airflow.shared_stream.sqs.{label}.watcher_failures") == 1
    assert f"1 message(s) of sqs stream {label} were not finished by every watcher" in caplog.text


async def test_two_triggerers_split_one_queue_between_their_watchers(sqs, aws_connection):
    """Limit 3: watchers of one queue on two triggerers are competing consumers; each sees a part."""
    url = sqs.create_queue()
    sent = set(sqs.send(url, [{"n": i} for i in range(40)]))
    async with (
        SharedStreamHarness(confirm_after=0.0) as first,
        SharedStreamHarness(confirm_after=0.0) as second,
    ):
        a = first.add(SqsSharedStreamTrigger(url, max_in_flight=5))
        b = second.add(SqsSharedStreamTrigger(url, max_in_flight=5))
        await eventually(lambda: sqs.depth(url), lambda d: d == (0, 0), timeout=60, what="drained")
        seen_a = {p["message_id"] for p in a.payloads}
        seen_b = {p["message_id"] for p in b.payloads}
    assert seen_a | seen_b == sent
    assert seen_a < sent, "each watcher saw only part of its stream"
    assert seen_b < sent, "each watcher saw only part of its stream"
