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
import sys
from collections.abc import Callable, Iterable
from typing import TypeVar

T = TypeVar("T")


def _import_all(names: Iterable[str]) -> None:
    for name in names:
        importlib.import_module(name)


async def import_off_loop(names: Iterable[str]) -> None:
    """Import the modules ``names`` that are not imported yet, in a worker thread."""
    missing = [name for name in names if name not in sys.modules]
    if missing:
        await asyncio.to_thread(_import_all, missing)


async def run_off_loop(work: Callable[[], T]) -> T:
    """Run synchronous start-up ``work`` (loading an SDK's data files) in a worker thread."""
    return await asyncio.to_thread(work)
