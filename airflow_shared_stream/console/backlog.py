"""
What a broker says is waiting, asked by the api-server directly where that is one cheap call.

Each broker says what it can count and how (``backlog()`` of its ``operations.py``, through the
registry of :mod:`airflow_shared_stream.brokers`); this module only runs the reads. Each read uses
the stream's own connection, is cached :data:`CACHE_SECONDS` per destination however many people
keep the page open, and takes nothing from the broker (no receive, no lock).

The api-server answers every request of the deployment on one event loop. A broker's
``operations.py`` imports its SDK (hundreds of modules, compiled from source where no bytecode
cache exists): it is imported in a worker thread, so a first look at the page on a loaded machine
does not hold every other request. A stream's reads run together, and one deadline of
:data:`TIMEOUT_SECONDS` bounds the import and the reads: a broker that does not answer costs the
page that bound, once, whatever the number of destinations and streams.

Errors never reach the page as text: a failed read is reported by its exception's type only,
so nothing the broker echoes back (a signed URL, a key id) can show.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import logging
import time
from collections.abc import Mapping
from typing import Any

from airflow_shared_stream.brokers import broker_operations
from airflow_shared_stream.common.operations import Backlog, DepthRead

log = logging.getLogger(__name__)

CACHE_SECONDS = 10.0
TIMEOUT_SECONDS = 5.0

_cache: dict[tuple[str, str, str], tuple[float, dict[str, Any]]] = {}


async def read_depth(depth: DepthRead, deadline: float | None = None) -> dict[str, Any]:
    """
    ``depth``'s answer, at most once per :data:`CACHE_SECONDS`; ``{"error": "<type>"}`` if it
    fails or is not read by ``deadline`` (the loop's time; :data:`TIMEOUT_SECONDS` from now if none).
    """
    cached = _cache.get(depth.cache_key)
    if cached is not None and time.monotonic() - cached[0] < CACHE_SECONDS:
        return cached[1]
    if deadline is None:
        deadline = asyncio.get_running_loop().time() + TIMEOUT_SECONDS
    try:
        answer: dict[str, Any] = await asyncio.wait_for(depth.read(), _left(deadline))
    except Exception as exc:
        log.info("Could not read %s of connection %s: %s", depth.what, depth.cache_key[0], type(exc).__name__)
        answer = {"error": type(exc).__name__}
    _cache[depth.cache_key] = (time.monotonic(), answer)
    return answer


def _left(deadline: float) -> float:
    """The seconds from now to ``deadline``, on the loop's clock (``wait_for`` takes a delay)."""
    return max(0.0, deadline - asyncio.get_running_loop().time())


def _backlog_reads(broker: str, trigger_kwargs: Mapping[str, Any]) -> Backlog | None:
    """What to read for the stream; imports the broker's operations and the SDK its reads use."""
    operations = broker_operations(broker)
    reads = operations.backlog(trigger_kwargs) if operations is not None else None
    for read in (reads or {}).values():
        for module in read.sdk_modules if isinstance(read, DepthRead) else ():
            importlib.import_module(module)
    return reads


_importing: dict[str, asyncio.Task[Any]] = {}
"""The worker thread importing each broker's operations, while it runs (one per broker)."""


async def _backlog_reads_off_loop(broker: str, trigger_kwargs: Mapping[str, Any]) -> Backlog | None:
    """
    :func:`_backlog_reads` in a worker thread, one import per broker at a time.

    The deadline ends the wait, not the thread: while one thread imports a broker's operations,
    every other stream of that broker, and every later look, waits here for it instead of
    taking a thread of its own to wait on Python's import lock, which filled the api-server's
    default executor (6 threads on 2 cores) and held everything else it runs.
    """
    loop = asyncio.get_running_loop()
    pending = _importing.get(broker)
    if pending is not None and pending.get_loop() is loop and not pending.done():
        with contextlib.suppress(Exception):  # its own failure is its stream's; this one tries anew
            await asyncio.shield(pending)  # cancelled by the deadline: the import is still running
    task = loop.create_task(asyncio.to_thread(_backlog_reads, broker, trigger_kwargs))
    if broker not in _importing or _importing[broker].done() or _importing[broker].get_loop() is not loop:
        _importing[broker] = task
    # Shielded: the deadline cancels this wait, while the task (and its thread) runs on, marking
    # the import in flight for the next stream and look.
    return await asyncio.shield(task)


async def _answer(read: DepthRead | Mapping[str, Any], deadline: float) -> dict[str, Any]:
    return await read_depth(read, deadline) if isinstance(read, DepthRead) else dict(read)


async def broker_backlog(broker: str, trigger_kwargs: dict[str, Any]) -> dict[str, Any] | None:
    """
    The stream's backlog and dead-letter depth where the broker tells it cheaply, else ``None``;
    ``{"error": "TimeoutError"}`` when the broker's operations are not even imported in time.
    """
    read_at = time.time()
    deadline = asyncio.get_running_loop().time() + TIMEOUT_SECONDS
    try:
        # The import goes on in its thread past the deadline: the next look finds it done.
        reads = await asyncio.wait_for(_backlog_reads_off_loop(broker, trigger_kwargs), _left(deadline))
    except asyncio.TimeoutError:
        log.info("The operations of broker %s were not imported in time", broker)
        return {"read_at": read_at, "error": "TimeoutError"}
    if reads is None:
        return None
    answers = await asyncio.gather(*(_answer(read, deadline) for read in reads.values()))
    return {"read_at": read_at, **dict(zip(reads, answers, strict=True))}
