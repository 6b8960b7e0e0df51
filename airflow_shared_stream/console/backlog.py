"""
What a broker says is waiting, asked by the api-server directly where that is one cheap call.

Each broker says what it can count and how (``backlog()`` of its ``operations.py``, through the
registry of :mod:`airflow_shared_stream.brokers`); this module only runs the reads. Each read uses
the stream's own connection, is cached :data:`CACHE_SECONDS` per destination however many people
keep the page open, and takes nothing from the broker (no receive, no lock).

Errors never reach the page as text: a failed read is reported by its exception's type only,
so nothing the broker echoes back (a signed URL, a key id) can show.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from airflow_shared_stream.brokers import broker_operations
from airflow_shared_stream.common.operations import DepthRead

log = logging.getLogger(__name__)

CACHE_SECONDS = 10.0
TIMEOUT_SECONDS = 5.0

_cache: dict[tuple[str, str, str], tuple[float, dict[str, Any]]] = {}


async def read_depth(depth: DepthRead) -> dict[str, Any]:
    """``depth``'s answer, at most once per :data:`CACHE_SECONDS`; ``{"error": "<type>"}`` if it fails."""
    cached = _cache.get(depth.cache_key)
    if cached is not None and time.monotonic() - cached[0] < CACHE_SECONDS:
        return cached[1]
    try:
        answer: dict[str, Any] = await asyncio.wait_for(depth.read(), TIMEOUT_SECONDS)
    except Exception as exc:
        log.info("Could not read %s of connection %s: %s", depth.what, depth.cache_key[0], type(exc).__name__)
        answer = {"error": type(exc).__name__}
    _cache[depth.cache_key] = (time.monotonic(), answer)
    return answer


async def broker_backlog(broker: str, trigger_kwargs: dict[str, Any]) -> dict[str, Any] | None:
    """The stream's backlog and dead-letter depth where the broker tells it cheaply, else ``None``."""
    backlog: dict[str, Any] = {"read_at": time.time()}
    operations = broker_operations(broker)
    reads = operations.backlog(trigger_kwargs) if operations is not None else None
    if reads is None:
        return None
    for name, read in reads.items():
        backlog[name] = await read_depth(read) if isinstance(read, DepthRead) else dict(read)
    return backlog
