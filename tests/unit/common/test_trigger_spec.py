"""The declarative trigger spec: what it derives, and the agreement check between watchers."""

from __future__ import annotations

import pytest

from airflow_shared_stream.common.errors import StreamShapeConflictError
from airflow_shared_stream.common.trigger import stream_shapes
from airflow_shared_stream.testing import InMemoryProducer, InMemoryTrigger, SharedStreamHarness


class CaseInsensitiveTrigger(InMemoryTrigger):
    """A broker whose upstream names are case-insensitive normalises them in stream_identity."""

    def stream_identity(self) -> tuple[str, ...]:
        return (self.stream.lower(),)

    def producer_kwargs(self) -> dict[str, object]:
        return {**super().producer_kwargs(), "stream": self.stream.lower()}


def test_the_key_is_the_normalised_identity_and_nothing_else():
    a = CaseInsensitiveTrigger("Orders", dead_letter="x", max_in_flight=10, match="body.a")
    b = CaseInsensitiveTrigger("orders", dead_letter="y", max_in_flight=20, max_payload_bytes=10)
    assert a.shared_stream_key() == b.shared_stream_key() == ("airflow_shared_stream.memory", "orders")


def test_serialize_carries_every_field_once_and_round_trips():
    trigger = InMemoryTrigger("orders", dead_letter="x", match="body.a", reject="body.b")
    classpath, kwargs = trigger.serialize()
    assert classpath == "airflow_shared_stream.testing.InMemoryTrigger"
    assert kwargs == {
        "stream": "orders",
        "dead_letter": "x",
        "max_in_flight": 500,
        "max_payload_bytes": 65536,
        "match": "body.a",
        "reject": "body.b",
    }
    assert InMemoryTrigger(**kwargs).serialize() == (classpath, kwargs)


def test_a_disagreement_names_every_argument():
    with pytest.raises(StreamShapeConflictError) as exc_info:
        InMemoryTrigger.check_shape_agrees(
            InMemoryTrigger("t", dead_letter="x").normalized_shape(),
            InMemoryTrigger("t", dead_letter="y", max_payload_bytes=10).normalized_shape(),
        )
    assert "dead_letter='y'" in str(exc_info.value)
    assert "max_payload_bytes=10" in str(exc_info.value)


async def test_a_disagreeing_watcher_fails_alone_and_the_others_keep_their_stream():
    InMemoryProducer.reset()
    async with SharedStreamHarness(confirm_after=0.0) as harness:
        first = harness.add(CaseInsensitiveTrigger("t", dead_letter="x"))
        agreeing = harness.add(CaseInsensitiveTrigger("T", dead_letter="x", match="body.n > `0`"))
        disagreeing = harness.add(CaseInsensitiveTrigger("t", dead_letter="y"))
        error = await disagreeing.wait_for_error()
        assert isinstance(error, StreamShapeConflictError)
        assert "dead_letter='y'" in str(error)
        assert "'x'" in str(error)
        InMemoryProducer.queue("t").publish({"n": 1})
        await first.wait_for_events(1)
        await agreeing.wait_for_events(1)
        assert first.error is None
        assert agreeing.error is None
    assert stream_shapes.shape_of(("airflow_shared_stream.memory", "t")) is None, "the registry leaked"


async def test_a_stream_rebuilt_after_every_watcher_left_takes_the_new_shape():
    InMemoryProducer.reset()
    async with SharedStreamHarness(confirm_after=0.0) as harness:
        old = harness.add(InMemoryTrigger("t2", dead_letter="x"))
        await harness.remove(old)
        new = harness.add(InMemoryTrigger("t2", dead_letter="y"))
        InMemoryProducer.queue("t2").publish({"n": 1})
        await new.wait_for_events(1)
        assert new.error is None
