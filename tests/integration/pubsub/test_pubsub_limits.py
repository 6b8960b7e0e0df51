"""
Pub/Sub's size limits on what the stream reads, against Google's emulator.

gRPC refuses a response over a channel's receive limit (4 MiB unless the channel says otherwise),
and Pub/Sub hands out up to 1,000 messages of up to 10 MB in one pull: every channel of the stream
must take a response as large as Pub/Sub sends, or a backlog of large messages fails every pull.
"""

from __future__ import annotations

import pytest

from tests.integration.pubsub.recording import RecordingTrigger, track
from tests.support.waiting import eventually

pytestmark = pytest.mark.integration


async def test_a_backlog_whose_pull_is_over_grpcs_default_receive_limit_is_read(pubsub, harness):
    """
    120 messages of 48 KB (each under ``max_payload_bytes``): a pull of 100 of them is 4.8 MB.

    On a channel built with gRPC's defaults every such pull failed with ResourceExhausted
    ("Received message larger than max"), the stream failed and, restarted, failed again: no
    event, ever. The emulator channel now takes the options Google's transports give the
    production channel (no receive limit).
    """
    topic, subscription = pubsub.topic_with_subscription()
    ledger = track(subscription, ack_deadline=10)
    sent = pubsub.publish(topic, [{"n": i, "pad": "x" * 48_000} for i in range(120)])
    watcher = harness.add(RecordingTrigger(subscription))
    await watcher.wait_for_events(120, timeout=60)
    assert sorted(p["message_id"] for p in watcher.payloads) == sorted(sent)
    await eventually(lambda: ledger.acked, lambda acked: acked == set(sent), timeout=30, what="acknowledged")
