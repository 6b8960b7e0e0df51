"""
Watchers of one upstream share one consumer, so they must agree on what shapes it.

:class:`ShapeConflictContract`: a second watcher asking for another dead-letter destination or
payload limit than the stream's consumer was built with would silently get the first one's; it
fails instead with :class:`~airflow_shared_stream.common.errors.StreamShapeConflictError`
naming the argument, and the stream goes on for the watchers that agree.
"""

from __future__ import annotations

import pytest

from airflow_shared_stream.common.errors import StreamShapeConflictError
from airflow_shared_stream.testing import SharedStreamHarness
from tests.integration.contract.broker import ids

pytestmark = pytest.mark.integration


class ShapeConflictContract:
    """Subclass with ``contract_broker``."""

    async def test_watchers_that_disagree_with_the_stream_fail_naming_the_argument(self, contract_broker):
        """
        One disagrees on the payload limit (every broker's), one on a setting of the broker's own
        (the dead-letter destination where the trigger names one); the stream goes on for the first.
        """
        broker = contract_broker
        stream = broker.create_stream()
        other = broker.other_shape(stream)
        async with SharedStreamHarness(confirm_after=0.0) as harness:
            first = harness.add(broker.trigger(stream))
            [before] = broker.publish(stream, [{"n": 1}])
            await first.wait_for_events(1, timeout=60)
            payload_limit = harness.add(broker.trigger(stream, max_payload_bytes=1000))
            own_setting = harness.add(broker.trigger(stream, **other))
            errors = [await w.wait_for_error(timeout=30) for w in (payload_limit, own_setting)]
            assert all(isinstance(e, StreamShapeConflictError) for e in errors), errors
            [after] = broker.publish(stream, [{"n": 2}])
            await first.wait_for_events(2, timeout=60)
            assert first.error is None
            assert ids(broker, first) == [before, after]
            assert payload_limit.events == own_setting.events == []
        assert "max_payload_bytes=1000" in str(errors[0])
        [name] = other
        assert f"{name}=" in str(errors[1]), errors[1]  # the value as the trigger normalised it
