"""
Test support only: hold an empty Fetch as Kafka does, on noida-db, in this process.

Kafka and Tansu hold a Fetch that finds no records until ``fetch.min.bytes`` arrive or the
request's ``max_wait_time`` (``fetch.max.wait.ms``) runs out; noida-db 0.2.3 answers it at once,
so a consumer on it sees a topic's changes sooner than it would on Kafka. :func:`hold_empty_fetches`
wraps :meth:`aiokafka.client.AIOKafkaClient.send` (through ``monkeypatch``, so for one test): a
Fetch with ``min_bytes`` > 0 that comes back early with no record bytes and no error returns only
after the rest of its ``max_wait_time``, at most :data:`HOLD` seconds. On Tansu and Kafka the
broker has waited already, so nothing changes there. ``SHARED_STREAM_TEST_KAFKA_FETCH_WAIT=0``
turns it off (to run a test against noida-db as it is).
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

import pytest
from aiokafka.client import AIOKafkaClient
from aiokafka.protocol.fetch import FetchRequest

ENV = "SHARED_STREAM_TEST_KAFKA_FETCH_WAIT"
"""``0`` in the environment: no fetch is held."""

HOLD = 0.1
"""The longest one empty Fetch is held, in seconds (the read delay it can add)."""


def _empty_and_clean(response: Any) -> bool:
    """True when a Fetch response carries no record bytes and no error code (any version)."""
    if getattr(response, "error_code", 0):  # v7+ request-level error
        return False
    for _topic, partitions in response.topics:
        for _partition, error_code, _highwater, *rest in partitions:
            if error_code or rest[-1]:  # the record set is the last field in every version
                return False
    return True


def hold_empty_fetches(monkeypatch: pytest.MonkeyPatch) -> bool:
    """Hold empty fetches for the rest of this test, unless :data:`ENV` is ``0``; whether it does."""
    if os.environ.get(ENV, "1") == "0":
        return False
    original = AIOKafkaClient.send

    async def send(self: Any, node_id: Any, request: Any, **kwargs: Any) -> Any:
        # aiokafka 0.14's FetchRequest keeps these on the request it encodes.
        max_wait_ms = getattr(request, "_max_wait_ms", 0) if isinstance(request, FetchRequest) else 0
        if max_wait_ms <= 0 or getattr(request, "_min_bytes", 0) <= 0:
            return await original(self, node_id, request, **kwargs)
        loop = asyncio.get_running_loop()
        started = loop.time()
        response = await original(self, node_id, request, **kwargs)
        rest = min(HOLD, max_wait_ms / 1000 - (loop.time() - started))
        if rest > 0.005 and _empty_and_clean(response):
            await asyncio.sleep(rest)
        return response

    monkeypatch.setattr(AIOKafkaClient, "send", send)
    return True
