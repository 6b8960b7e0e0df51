"""The trivial event trigger of bench/startup.py: fires at start, then waits (what the triggerer costs)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from airflow.triggers.base import BaseEventTrigger, TriggerEvent


class FireAtOnceTrigger(BaseEventTrigger):
    """Yield one event as soon as it runs, then wait to be cancelled."""

    def __init__(self, n: int) -> None:
        super().__init__()
        self.n = n

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (f"{type(self).__module__}.{type(self).__qualname__}", {"n": self.n})

    async def run(self) -> AsyncIterator[TriggerEvent]:
        yield TriggerEvent({"fired": self.n})
        await asyncio.Event().wait()


def kafka_value(message: Any) -> Any:
    """The official Kafka trigger's ``apply_function``: every message fires, with its value."""
    return {"value": message.value().decode()}
