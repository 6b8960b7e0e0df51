"""
The names of the shared-stream metrics and the stream label they carry.

Below both the metrics (:mod:`.metrics`, which sends them) and the stream figures
(:mod:`.figures`, which keeps some of them for the Streams page), so neither imports the other
for a name. docs/metrics.rst lists them all.
"""

from __future__ import annotations

import re

PREFIX = "shared_stream"

# Counters
RECEIVED = "received"
"""Messages taken from the broker and broadcast to the stream's watchers."""
FANNED_OUT = "fanned_out"
"""Watcher deliveries: a message broadcast to three online watchers counts three."""
ACKED = "acked"
"""Messages settled ACK (deleted / committed / acknowledged / completed)."""
REDELIVERED = "redelivered"
"""Messages settled REDELIVER (made visible again, nacked, abandoned, sought back)."""
DEAD_LETTERED = "dead_lettered"
"""Messages settled DEAD-LETTER (copied to the dead-letter destination, then removed)."""
NO_SUBSCRIBER = "no_subscriber"
"""Messages that came back because no watcher was online when they were broadcast."""
CREDIT_WAITS = "credit_waits"
"""Times the receive loop found the credit window full and waited for an advance."""
LEASE_EXTENSIONS = "lease_extensions"
"""Leases extended by the lease keeper (one per message per renewal)."""
LEASE_LOSSES = "lease_losses"
"""Leases the broker refused to extend, or the keeper let go at the ack timeout."""
WATCHER_FAILURES = "watcher_failures"
"""Watcher deliveries that failed: a trigger failed, or did not finish its event (a hung filter,
an unpersisted event) within ``[triggerer] shared_stream_ack_timeout``. The message is redelivered."""

# Gauges
IN_FLIGHT = "in_flight"
"""Messages yielded to the manager and not yet advanced (the credit window's use)."""
BROKER_LAG = "broker_lag"
"""What the broker reports as waiting (SQS ApproximateNumberOfMessages; Kafka end - committed)."""

# Timers
ADVANCE_LATENCY = "advance_latency"
"""Milliseconds the broker calls one ``advance`` made inline took (Kafka: a dead-letter send;
leased queues: dead letters, redeliveries, ordered ACKs). Advances that only hand work on (a
commit target to the committer, an ACK to the ACK batcher) are not timed: one timer per message
would be most of a stream's StatsD traffic and say nothing."""

ALL_METRICS = (
    RECEIVED,
    FANNED_OUT,
    ACKED,
    REDELIVERED,
    DEAD_LETTERED,
    NO_SUBSCRIBER,
    CREDIT_WAITS,
    LEASE_EXTENSIONS,
    LEASE_LOSSES,
    WATCHER_FAILURES,
    IN_FLIGHT,
    BROKER_LAG,
    ADVANCE_LATENCY,
)


_UNSAFE = re.compile(r"[^A-Za-z0-9_-]+")


def stream_label(*parts: str) -> str:
    """A metric-safe label from upstream names: ``orders.fifo`` becomes ``orders_fifo``."""
    label = "_".join(_UNSAFE.sub("_", part).strip("_") for part in parts if part)
    return label[:120] or "unnamed"
