"""An event trigger that reports, from inside the trigger runner, what its collector walks (issue 50)."""

from __future__ import annotations

import asyncio
import gc
import sys
from collections.abc import AsyncIterator
from typing import Any

from airflow.triggers.base import BaseEventTrigger, TriggerEvent

WATCHED_MODULES = ("airflow", "airflow_shared_stream.sqs.producer", "aiobotocore")
"""Modules the triggerer's supervisor had imported before it forked its runner."""


class HeapProbeTrigger(BaseEventTrigger):
    """Yield which of :data:`WATCHED_MODULES` the runner's collections walk, then wait."""

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (f"{type(self).__module__}.{type(self).__qualname__}", {})

    async def run(self) -> AsyncIterator[TriggerEvent]:
        walked = {id(o) for o in gc.get_objects()}
        collected = [
            name for name in WATCHED_MODULES if name in sys.modules and id(sys.modules[name]) in walked
        ]
        yield TriggerEvent(
            {"collected": collected, "imported": [n for n in WATCHED_MODULES if n in sys.modules]}
        )
        await asyncio.Event().wait()
