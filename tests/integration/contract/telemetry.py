"""
Every stream sends the same metrics, through Airflow's own ``Stats``, to a real StatsD listener.

:class:`TelemetryContract`: a stream's counters (received, fanned out, acked, dead-lettered,
redelivered), its in-flight gauge and advance timer, and a full credit window counted; metric
names carry the stream's label only, never a credential or an endpoint.
:class:`LeaseTelemetryContract` (leased queues): a lease held past the broker's own timeout is
counted as extended.
"""

from __future__ import annotations

import pytest

from airflow_shared_stream.testing import SharedStreamHarness
from tests.integration.contract.broker import ContractBroker
from tests.support.statsd import StatsdListener
from tests.support.waiting import eventually

pytestmark = pytest.mark.integration


class TelemetryContract:
    """The per-stream metrics every broker sends (subclass with ``contract_broker``)."""

    async def test_stream_metrics_count_each_outcome_and_carry_no_secret(
        self, contract_broker: ContractBroker, statsd: StatsdListener
    ):
        broker = contract_broker
        stream = broker.create_stream()
        prefix = broker.metric_prefix(stream)
        async with SharedStreamHarness(confirm_after=0.2) as harness:
            everything = harness.add(broker.trigger(stream, reject="body.bad"))
            harness.add(broker.trigger(stream, match="body.n == `1`"))
            broker.publish(stream, [{"n": 1}, {"n": 2}, {"bad": True}])
            await everything.wait_for_events(2)
            await eventually(lambda: broker.remaining(stream), lambda r: r == 0, timeout=30, what="settled")
            await eventually(
                lambda: statsd.counter(f"{prefix}.acked"), lambda n: n == 2, timeout=20, what="acked counter"
            )
        # Three messages, two watchers online, one rejected.
        statsd.assert_stream_counts(prefix, received=3, fanned_out=6, dead_lettered=1, redelivered=0)
        assert statsd.has(f"{prefix}.broker_lag") == broker.reports_broker_lag
        lines = statsd.read()
        for secret in broker.metric_secrets():
            assert not [line for line in lines if secret in line], f"{secret!r} in a metric"

    async def test_a_full_credit_window_is_counted(
        self, contract_broker: ContractBroker, statsd: StatsdListener
    ):
        broker = contract_broker
        stream = broker.create_stream()
        prefix = broker.metric_prefix(stream)
        broker.publish(stream, [{"n": i} for i in range(6)])
        async with SharedStreamHarness(confirm_after=0.3) as harness:
            watcher = harness.add(broker.trigger(stream, max_in_flight=2))
            await watcher.wait_for_events(6, timeout=60)
        assert statsd.counter(f"{prefix}.credit_waits") >= 2


class LeaseTelemetryContract:
    """Leased queues count the leases they extend (subclass with ``contract_broker``)."""

    async def test_a_lease_held_past_the_brokers_timeout_is_counted_as_extended(
        self, contract_broker: ContractBroker, statsd: StatsdListener
    ):
        broker = contract_broker
        lease = broker.lease_seconds_min
        stream = broker.create_stream(lease_seconds=lease)
        prefix = broker.metric_prefix(stream)
        async with SharedStreamHarness(confirm_after=lease * 1.25) as harness:
            watcher = harness.add(broker.trigger(stream))
            broker.publish(stream, [{"n": 1}, {"n": 2}])
            await watcher.wait_for_events(2)
            await eventually(
                lambda: broker.remaining(stream), lambda r: r == 0, timeout=lease * 10, what="acked"
            )
        assert statsd.counter(f"{prefix}.lease_extensions") >= 2
