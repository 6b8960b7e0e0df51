"""The pause after a batch nobody was subscribed to, before its messages are offered again."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

NO_SUBSCRIBER_BACKOFF_MIN = 0.25
NO_SUBSCRIBER_BACKOFF_MAX = 5.0
"""The pause doubles from MIN up to MAX seconds while nobody is subscribed."""


class NoSubscriberBackoff:
    """Pause receiving after batches that nobody was subscribed to; reset once someone is."""

    def __init__(
        self,
        minimum: float = NO_SUBSCRIBER_BACKOFF_MIN,
        maximum: float = NO_SUBSCRIBER_BACKOFF_MAX,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.minimum, self.maximum = minimum, maximum
        self._clock = clock
        self.delay = 0.0
        """The pause now in force, 0 when someone was subscribed last (read it; the methods set
        it). An attribute, not a property: every ACK-only advance reads it."""
        self._resume_at = 0.0

    def nobody_subscribed(self) -> None:
        self.delay = min(self.maximum, max(self.minimum, self.delay * 2))
        self._resume_at = self._clock() + self.delay

    def someone_subscribed(self) -> None:
        self.delay = 0.0
        self._resume_at = 0.0

    async def wait(self) -> None:
        remaining = self._resume_at - self._clock()
        if remaining > 0:
            await asyncio.sleep(remaining)
