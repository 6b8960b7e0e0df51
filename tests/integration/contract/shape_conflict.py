"""
Watchers of one upstream share one consumer, so they must agree on what shapes it.

:class:`ShapeConflictContract`: a second watcher asking for another dead-letter destination or
payload limit than the stream's consumer was built with would silently get the first one's; it
fails instead with :class:`~airflow_shared_stream.common.errors.StreamShapeConflictError`
naming the argument, and the stream goes on for the watchers that agree.
"""

from __future__ import annotations

from typing import Any

import pytest

from airflow_shared_stream.common.errors import StreamShapeConflictError
from airflow_shared_stream.testing import SharedStreamHarness
from tests.integration.contract.broker import ContractBroker, ids

pytestmark = pytest.mark.integration


class ShapeConflictContract:
    """Subclass with ``contract_broker``."""

    async def _second_watcher_conflicts(
        self, broker: ContractBroker, stream: Any, conflicting: dict[str, Any]
    ) -> str:
        """Start a watcher, then one with ``conflicting`` kwargs: return its error; the first goes on."""
        async with SharedStreamHarness(confirm_after=0.0) as harness:
            first = harness.add(broker.trigger(stream))
            [before] = broker.publish(stream, [{"n": 1}])
            await first.wait_for_events(1, timeout=60)
            second = harness.add(broker.trigger(stream, **conflicting))
            error = await second.wait_for_error(timeout=30)
            assert isinstance(error, StreamShapeConflictError), repr(error)
            [after] = broker.publish(stream, [{"n": 2}])
            await first.wait_for_events(2, timeout=60)
            assert first.error is None
            assert ids(broker, first) == [before, after]
            assert second.events == []
        return str(error)

    async def test_a_watcher_with_another_payload_limit_fails_naming_it(self, contract_broker):
        stream = contract_broker.create_stream()
        message = await self._second_watcher_conflicts(contract_broker, stream, {"max_payload_bytes": 1000})
        assert "max_payload_bytes=1000" in message

    async def test_a_watcher_with_another_broker_setting_fails_naming_it(self, contract_broker):
        stream = contract_broker.create_stream()
        other = contract_broker.other_shape(stream)
        message = await self._second_watcher_conflicts(contract_broker, stream, other)
        [name] = other
        assert f"{name}=" in message, message  # the value as the trigger normalised it
