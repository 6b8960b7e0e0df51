"""
Watchers declared through common.messaging's ``MessageQueueTrigger`` behave as the direct form.

``MessageQueueTrigger(scheme="shared+<broker>", ...)`` builds our trigger and returns its
``serialize()``; the harness, like the triggerer, rebuilds every watcher from that. Each broker's
suite subclasses :class:`MessageQueueContract` with its ``contract_broker`` (the shared-stream
contract's adapter, tests/integration/contract/broker.py) and ``scheme``, and these tests run
against its real broker: N watchers in the ``MessageQueueTrigger`` form share one consumer with
a direct-form watcher, and the same messages end acked, dead-lettered and fired in both forms.

A watcher's arguments are the contract adapter's trigger's own ``serialize()`` kwargs, which is
what a Dag author would pass either way (for Kafka the adapter already spells ``body.`` as
``value.`` in ``match`` and ``reject``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar

import pytest
from airflow.providers.common.messaging.triggers.msg_queue import MessageQueueTrigger
from airflow.triggers.base import BaseEventTrigger

from airflow_shared_stream.common.errors import StreamShapeConflictError
from airflow_shared_stream.queues import SCHEMES
from airflow_shared_stream.testing import SharedStreamHarness
from tests.integration.contract.broker import ContractBroker, ids
from tests.support.waiting import eventually

pytestmark = pytest.mark.integration

Declare = Callable[..., BaseEventTrigger]


class MessageQueueContract:
    """Subclass with ``scheme`` and the ``contract_broker`` fixture of the broker's contract."""

    scheme: ClassVar[str]

    @pytest.fixture
    def contract_broker(self) -> ContractBroker:  # pragma: no cover - every broker overrides it
        raise NotImplementedError

    @property
    def trigger_class(self) -> type[BaseEventTrigger]:
        return SCHEMES[self.scheme]().trigger_class()

    @staticmethod
    def arguments(broker: ContractBroker, stream: Any, **kwargs: Any) -> dict[str, Any]:
        return broker.trigger(stream, **kwargs).serialize()[1]

    def through_common_messaging(self, broker: ContractBroker, stream: Any, **kwargs: Any) -> Any:
        return MessageQueueTrigger(scheme=self.scheme, **self.arguments(broker, stream, **kwargs))

    def direct(self, broker: ContractBroker, stream: Any, **kwargs: Any) -> BaseEventTrigger:
        return self.trigger_class(**self.arguments(broker, stream, **kwargs))

    async def test_watchers_declared_through_message_queue_trigger_share_one_consumer(self, contract_broker):
        broker = contract_broker
        stream = broker.create_stream()
        async with SharedStreamHarness(confirm_after=0.0) as harness:
            watchers = [harness.add(self.through_common_messaging(broker, stream)) for _ in range(3)]
            watchers.append(harness.add(self.direct(broker, stream)))  # the direct form beside them
            sent = broker.publish(stream, [{"n": i} for i in range(5)])
            for watcher in watchers:
                await watcher.wait_for_events(5, timeout=60)
            await eventually(lambda: broker.remaining(stream), lambda r: r == 0, timeout=60, what="acked")
            assert len(harness.manager._groups) == 1, "the watchers did not share one consumer"
        # The triggerer runs our trigger class itself, rebuilt from what the Dag serialized.
        assert {type(w.trigger) for w in watchers} == {self.trigger_class}
        for watcher in watchers:
            assert sorted(ids(broker, watcher)) == sorted(sent)

    async def test_a_watcher_that_disagrees_on_the_shared_consumer_fails_naming_the_argument(
        self, contract_broker
    ):
        # The two forms are one stream, so the stream-identity rule spans them: no silent split.
        broker = contract_broker
        stream = broker.create_stream()
        async with SharedStreamHarness(confirm_after=0.0) as harness:
            direct = harness.add(self.direct(broker, stream, max_in_flight=100))
            [sent] = broker.publish(stream, [{"n": 1}])
            await direct.wait_for_events(1, timeout=60)
            disagreeing = harness.add(self.through_common_messaging(broker, stream, max_in_flight=50))
            error = await disagreeing.wait_for_error(timeout=30)
        assert isinstance(error, StreamShapeConflictError)
        assert "max_in_flight=50" in str(error)
        assert ids(broker, direct) == [sent]

    async def _outcome(self, broker: ContractBroker, declare: Declare) -> dict[str, Any]:
        """Fired, acked and dead-lettered messages of one scenario, by position in the publish order."""
        stream = broker.create_stream()
        async with SharedStreamHarness(confirm_after=0.0) as harness:
            watchers = {
                "everything": harness.add(declare(broker, stream)),
                "small": harness.add(declare(broker, stream, match="body.n < `2`")),
                "strict": harness.add(declare(broker, stream, reject="body.bad")),
            }
            sent = broker.publish(stream, [{"n": 1}, {"bad": True}, {"n": 2}])
            await eventually(lambda: broker.remaining(stream), lambda r: r == 0, timeout=60, what="settled")
            dead: list[Any] = []

            def collect() -> list[Any]:
                dead.extend(broker.dead_letters(stream))
                return list(dead)

            await eventually(collect, lambda d: len(d) >= 1, timeout=30, what="a dead letter")
        assert not [w.error for w in watchers.values() if w.error is not None]
        return {
            "fired": {name: sorted(sent.index(i) for i in ids(broker, w)) for name, w in watchers.items()},
            "dead_letters": sorted(str(d) for d in dead),
        }

    async def test_acks_rejects_and_dead_letters_are_the_direct_forms(self, contract_broker):
        direct = await self._outcome(contract_broker, self.direct)
        through_common_messaging = await self._outcome(contract_broker, self.through_common_messaging)
        assert through_common_messaging == direct
        # ...and the direct form did what the shared-stream contract says (not the same bug twice).
        assert direct["dead_letters"] == [str({"bad": True})]
        assert direct["fired"]["small"] == [0]
        assert 1 not in direct["fired"]["strict"]
