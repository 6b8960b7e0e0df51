"""
Two streams starting while the first still imports its producer module (FAULT_MODEL class 13).

A stream names its producer by path and imports the module (and its broker SDK) in a worker
thread when it opens (``ImportedOffLoop``). Python puts a module into ``sys.modules`` when its
import *starts*: while the first stream's thread is still inside the SDK's import, a second
stream of the same broker (another queue, started in the same triggerer pass) must not take the
half-imported module for an imported one and import it on the runner's loop, where the import
lock makes the loop wait for the whole of the first thread's import: the blocked loop the change
removed, back for every stream after the first.

The import is held at an event (``tests.support.import_gate``), not a duration: the loop must
build the second stream's producer and run on while the import is still held.
"""

from __future__ import annotations

import asyncio
import sys
import threading
from typing import Any

from airflow_shared_stream.testing import InMemoryProducer, InMemoryTrigger, SharedStreamHarness
from tests.support import import_gate

GATED = "tests.support.gated_producer"
built: dict[str, threading.Event] = {}


class GatedTrigger(InMemoryTrigger):
    """An in-memory stream whose producer module is imported when the stream opens."""

    broker = "gated"
    producer_class = None
    producer_path = f"{GATED}:GatedProducer"

    @classmethod
    def create_shared_stream_producer(cls, kwargs: dict[str, Any]) -> Any:
        producer = super().create_shared_stream_producer(kwargs)
        built.setdefault(kwargs["stream"], threading.Event()).set()
        return producer


resolved: list[str] = []


class CountingTrigger(GatedTrigger):
    """Records each time a producer is built (its class resolved)."""

    @classmethod
    def resolve_producer_class(cls) -> Any:
        resolved.append("built")
        return super().resolve_producer_class()


async def test_a_second_stream_starting_during_the_first_ones_import_does_not_hold_the_loop() -> None:
    sys.modules.pop(GATED, None)
    import_gate.entered.clear()
    import_gate.release.clear()
    built.clear()
    built["a"], built["b"] = threading.Event(), threading.Event()
    InMemoryProducer.reset()
    # Only so that a failing run ends: a loop held by the import cannot release the gate itself.
    watchdog = threading.Timer(20, import_gate.release.set)
    watchdog.start()
    try:
        async with SharedStreamHarness(confirm_after=0.0) as harness:
            first = harness.add(GatedTrigger("a"))
            await asyncio.to_thread(import_gate.entered.wait, 30)  # its thread is in the import
            assert GATED in sys.modules
            assert not import_gate.release.is_set()
            second = harness.add(GatedTrigger("b"))
            await asyncio.to_thread(built["b"].wait, 30)
            # Back on the loop: it ran while the first stream's import is still held.
            assert not import_gate.release.is_set(), (
                "the runner's loop was held by the first stream's producer import while the "
                "second stream started (released only by the watchdog)"
            )
            import_gate.release.set()
            InMemoryProducer.queue("a").publish({"n": 1})
            InMemoryProducer.queue("b").publish({"n": 2})
            await first.wait_for_events(1)
            await second.wait_for_events(1)
            assert first.error is None
            assert second.error is None
    finally:
        import_gate.release.set()
        watchdog.cancel()
        sys.modules.pop(GATED, None)


async def test_a_stream_cancelled_while_its_producer_module_imports_builds_no_producer() -> None:
    """
    The last watcher leaves while the stream's thread is still inside the producer module's import
    (attack on issue 50): the stream stops at once, the import finishes in its thread, and no
    producer is built or connected after the cancel; a watcher added later gets a stream of its
    own that reads what was published meanwhile.
    """
    sys.modules.pop(GATED, None)
    import_gate.entered.clear()
    import_gate.release.clear()
    built.clear()
    InMemoryProducer.reset()
    resolved.clear()
    watchdog = threading.Timer(20, import_gate.release.set)
    watchdog.start()
    try:
        async with SharedStreamHarness(confirm_after=0.0) as harness:
            leaving = harness.add(CountingTrigger("c"))
            await asyncio.to_thread(import_gate.entered.wait, 30)
            await harness.remove(leaving)
            assert not import_gate.release.is_set(), "the stream's stop waited for the import"
            assert harness.manager._groups == {}
            import_gate.release.set()
            await asyncio.to_thread(lambda: [__import__(GATED)])  # the import finishes in its thread
            assert resolved == [], "a producer was built after its stream was cancelled"
            InMemoryProducer.queue("c").publish({"n": 1})
            later = harness.add(CountingTrigger("c"))
            events = await later.wait_for_events(1)
            assert [e.payload["body"] for e in events] == [{"n": 1}]
            assert later.error is None
    finally:
        import_gate.release.set()
        watchdog.cancel()
        sys.modules.pop(GATED, None)


class BrokenSdkTrigger(InMemoryTrigger):
    """An in-memory stream whose producer module's SDK is installed but cannot be imported."""

    broker = "broken"
    producer_class = None
    producer_path = "tests.support.broken_producer:BrokenProducer"


async def test_a_producer_module_that_cannot_be_imported_fails_its_stream_once_naming_it() -> None:
    """
    A broker SDK found (``require_sdk`` only finds it) but broken (a dependency missing) fails its
    stream once, with an error naming the producer module it could not import and what was missing
    (attack on issue 50). Before issue 50 the trigger module imported the SDK and the error named
    the provider's extra; imported in the stream's thread, the watchers got a bare
    ``No module named '...'`` naming neither the stream's producer nor its broker.
    """
    InMemoryProducer.reset()
    async with SharedStreamHarness(confirm_after=0.0) as harness:
        watcher = harness.add(BrokenSdkTrigger("d"))
        error = await watcher.wait_for_error()
    assert isinstance(error, ImportError), repr(error)
    assert "tests.support.broken_producer" in str(error), str(error)
    assert "airflow_shared_stream_missing_sdk_dependency" in str(error), str(error)
    assert "tests.support.broken_producer" not in sys.modules
