"""
Settling keeps pace with receiving, with the broker in a process of its own (as in production).

The producer's receive loop always has a ``receive_messages`` call pending on its receiver. A
``complete_message`` sent meanwhile waits for its outcome by polling the connection the pending
receive is reading from, and measured against the test server in another process that costs about
0.2 s per call: settled one after another, 200 messages took 40 s to complete (5 a second)
while they had been received and fired in under one. (A server on a thread of the test process
answers within the GIL's switch interval, which hides it.)

The test queue's locks last 30 s. On a loaded machine this test once saw 201 dispositions for 200
messages; a refused completion (a lock that ran out) and a release both count as one. Locks are
now renewed from what the broker says (every 10 s here, not every 20 s against an assumed 60 s
lock), and the checks below tell the two apart.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

import pytest

from airflow_shared_stream.servicebus.trigger import ServiceBusSharedStreamTrigger
from airflow_shared_stream.testing import SharedStreamHarness
from tests.support.servicebus_server import ServiceBusServerProcess
from tests.support.waiting import eventually

pytestmark = pytest.mark.integration

MESSAGES = 200


@pytest.fixture
def servicebus_process(monkeypatch: pytest.MonkeyPatch) -> Iterator[ServiceBusServerProcess]:
    server = ServiceBusServerProcess()
    try:
        monkeypatch.setenv("AIRFLOW_CONN_AZURE_SERVICE_BUS_DEFAULT", json.dumps(server.connection()))
        yield server
    finally:
        server.close()


async def test_settlements_are_not_paid_one_round_trip_at_a_time(servicebus_process):
    queue = servicebus_process.call("create_queue", None)
    servicebus_process.call("send", queue, [{"n": n} for n in range(MESSAGES)])
    async with SharedStreamHarness(confirm_after=0.0) as harness:
        watcher = harness.add(ServiceBusSharedStreamTrigger(queue_name=queue, max_wait_time=5.0))
        await watcher.wait_for_events(MESSAGES, timeout=60)
        fired = time.monotonic()
        # 20 s: one round trip per message would need 40 s; together they need well under 1 s.
        await eventually(
            lambda: servicebus_process.call("message_count", queue),
            lambda left: left == 0,
            timeout=20,
            what=f"all {MESSAGES} messages completed on the broker",
        )
        settled_in = time.monotonic() - fired
    assert sorted(p["body"]["n"] for p in watcher.payloads) == list(range(MESSAGES))
    # Each completed once, none redelivered. Not "one disposition per message": a refused
    # completion is a disposition too, and so is a release (the SDK gives back, unprocessed and
    # uncounted against the delivery limit, a message that reaches it while no receive call waits).
    counters = servicebus_process.call("counters")
    assert counters["completed_deliveries"] == MESSAGES, counters
    assert counters["lock_lost_settlements"] == 0, counters  # no lock ran out before its completion
    assert counters["locked_deliveries"] == MESSAGES + counters["released_deliveries"], counters
    # ... in runs of consecutive deliveries, one disposition per run (servicebus/ranges.py).
    assert servicebus_process.counts()["settle"] < MESSAGES / 10
    print(f"{MESSAGES} messages completed {settled_in:.2f} s after the last was fired")
