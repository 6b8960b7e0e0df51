"""An event trigger that forks inside the trigger runner and reports what the fork did there (issue 50)."""

from __future__ import annotations

import asyncio
import gc
import os
import threading
import time
from collections.abc import AsyncIterator
from typing import Any

from airflow.triggers.base import BaseEventTrigger, TriggerEvent


class ForkProbeTrigger(BaseEventTrigger):
    """
    Fork once on the runner's loop (as a trigger using ``multiprocessing``'s fork context does),
    then yield the threads the fork left in the runner, how long ``os.fork`` held the loop and the
    runner's frozen heap (``gc.get_freeze_count``) before and after it.
    """

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (f"{type(self).__module__}.{type(self).__qualname__}", {})

    async def run(self) -> AsyncIterator[TriggerEvent]:
        before = {thread.name for thread in threading.enumerate()}
        frozen_before = gc.get_freeze_count()
        started = time.monotonic()
        pid = os.fork()
        if pid == 0:  # the grandchild: gone at once
            os._exit(0)
        held = time.monotonic() - started
        after = {thread.name for thread in threading.enumerate()}  # before the waitpid's own thread
        frozen_after = gc.get_freeze_count()
        await asyncio.to_thread(os.waitpid, pid, 0)
        yield TriggerEvent(
            {
                "new_threads": sorted(after - before),
                "fork_seconds": round(held, 3),
                "frozen_before": frozen_before,
                "frozen_after": frozen_after,
            }
        )
        await asyncio.Event().wait()
