"""Receives read ahead: the next round trips to the broker overlap the fan-out of this batch."""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Callable, Coroutine
from typing import Any, Generic, TypeVar

from airflow_shared_stream.common.flow_control import CreditWindow

Batch = TypeVar("Batch")


class ReadAhead(Generic[Batch]):
    """
    Receives in flight, oldest first, each for the credits it reserved as it started.

    Reserving at the start means no receive waits for credit while others hold credits in
    messages not yet yielded (the window cannot deadlock); each asks for at most its share of
    the window, so one receive does not take every credit and leave the others nothing.
    """

    def __init__(
        self,
        credits: CreditWindow,
        receive: Callable[[int], Coroutine[Any, Any, Batch]],
        *,
        name: str,
    ) -> None:
        self._credits = credits
        self._receive = receive
        self._name = name
        self._tasks: collections.deque[asyncio.Task[Batch]] = collections.deque()

    def __bool__(self) -> bool:
        return bool(self._tasks)

    def start(self, in_flight: int, limit: int | None) -> None:
        """Start receives, up to ``in_flight`` of them, each for at most ``limit`` credits free now."""
        while len(self._tasks) < in_flight:
            credits = min(self._credits.available, self.size(in_flight, limit))
            if credits <= 0:
                return
            self._credits.reserve(credits)
            self._tasks.append(asyncio.create_task(self._receive(credits), name=self._name))

    def size(self, in_flight: int, limit: int | None) -> int:
        """Most messages one receive asks for: the broker's ``limit`` and its share of the window."""
        share = max(1, self._credits.max_in_flight // in_flight)
        return min(share, limit) if limit else share

    def any_done(self) -> bool:
        """Some receive returned and its batch was not taken yet."""
        return any(task.done() for task in self._tasks)

    async def next(self) -> Batch:
        """
        The batch of the first receive to return (the oldest first when several have).

        A receive the broker holds open (a long poll with nothing for it) does not hold back
        batches the others already got, which is why more than one receive in flight is only
        for streams whose batches may be yielded in the order they arrive (no ordered lanes).
        ``asyncio.wait``, not ``await task``: a caller cancelled here leaves the receives running
        (:meth:`stop` ends them).
        """
        await asyncio.wait(self._tasks, return_when=asyncio.FIRST_COMPLETED)
        done = next(task for task in self._tasks if task.done())
        batch = done.result()
        self._tasks.remove(done)
        return batch

    async def stop(self, wait: float = 0.0) -> None:
        """Cancel the receives in flight after letting them return for up to ``wait`` seconds."""
        receiving = list(self._tasks)
        if receiving and wait > 0:
            await asyncio.wait(receiving, timeout=wait)
        self._tasks.clear()
        for task in receiving:
            task.cancel()
        await asyncio.gather(*receiving, return_exceptions=True)
