"""Polling helpers for tests that wait on a real broker."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")


async def eventually(probe: Callable[[], T], until: Callable[[T], bool], *, timeout: float, what: str) -> T:
    """
    Call the blocking ``probe`` (in a thread) until ``until(result)``; return the result.

    Fails with the last observed value, so a red test says how far the system got.
    """
    deadline = time.monotonic() + timeout
    last: Any = None
    while True:
        last = await asyncio.to_thread(probe)
        if until(last):
            return last
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}; last value: {last!r}")
        await asyncio.sleep(0.2)
