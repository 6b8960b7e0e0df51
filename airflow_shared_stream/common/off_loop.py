"""
Start-up work of a stream done in a worker thread, not on the triggerer's event loop.

The triggerer runs every trigger of the deployment on one event loop. Whatever a stream does
synchronously when it starts holds all of them: the first import of a broker SDK (hundreds of
modules, each compiled from source where no bytecode cache exists) and the SDK's own data files
(botocore's endpoint and service models) held the loop for seconds on a loaded machine, long
enough for the triggerer's supervisor to call the runner deadlocked and reassign its triggers.
Imported in a thread, the same work only shares the interpreter with the loop, which keeps
running between modules.
"""

from __future__ import annotations

import asyncio
import importlib
from collections.abc import AsyncIterator, Callable, Hashable, Iterable, Sequence
from typing import Any, TypeVar

from airflow.triggers.shared_stream import AdvanceItem, SharedStreamProducer

from airflow_shared_stream.common.import_state import imported

T = TypeVar("T")


def _import_all(names: Iterable[str]) -> None:
    for name in names:
        importlib.import_module(name)


async def import_off_loop(names: Iterable[str]) -> None:
    """Import the modules ``names`` that are not imported yet, in a worker thread."""
    missing = [name for name in names if not imported(name)]
    if missing:
        await asyncio.to_thread(_import_all, missing)


async def run_off_loop(work: Callable[[], T]) -> T:
    """Run synchronous start-up ``work`` (loading an SDK's data files) in a worker thread."""
    return await asyncio.to_thread(work)


class ImportedOffLoop(SharedStreamProducer):
    """
    A stream's producer whose module is imported in a worker thread when the stream opens.

    Airflow builds a stream's producer synchronously on the runner's event loop, and imports the
    trigger's module there too: a producer module that imports its broker SDK held that loop.
    This stands in for the producer until :meth:`open_stream`, which imports ``module`` off the
    loop, builds Airflow's stats registry there too (the stream's first metric would build it on
    the loop), then builds the producer (``build``) and hands every call to it.
    """

    def __init__(self, module: str, build: Callable[[], SharedStreamProducer]) -> None:
        self.module = module
        self._build = build
        self._producer: SharedStreamProducer | None = None

    @property
    def producer(self) -> SharedStreamProducer:
        """The producer itself; built on first use (outside the triggerer, where no loop waits)."""
        if self._producer is None:
            self._producer = self._build()
        return self._producer

    async def open_stream(self) -> AsyncIterator[tuple[Any, Any]]:
        try:
            await import_off_loop([self.module])
        except ImportError as exc:
            # The trigger's module only found the SDK: one found but broken (a dependency missing)
            # fails here, where a bare "No module named ..." would name neither stream nor broker.
            raise ImportError(
                f"the stream's producer module {self.module} could not be imported: {exc} (its "
                "broker SDK, or a dependency of it, is missing or broken: reinstall the "
                "provider's extra for this broker)",
                name=exc.name,
            ) from exc
        from airflow_shared_stream.common.metrics import warm_up_stats

        await run_off_loop(warm_up_stats)
        async for item in self.producer.open_stream():
            yield item

    async def advance(self, batch: Sequence[AdvanceItem]) -> None:
        await self.producer.advance(batch)

    def get_advance_lane(self, broker_payload: Any) -> Hashable:
        return self.producer.get_advance_lane(broker_payload)

    async def aclose(self) -> None:
        if self._producer is not None:
            await self._producer.aclose()

    def __getattr__(self, name: str) -> Any:
        # What the stream's own producer offers beyond the four calls (its metrics, its ids).
        if name.startswith("__") or name in {"module", "_build", "_producer"}:
            raise AttributeError(name)
        return getattr(self.producer, name)
