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
