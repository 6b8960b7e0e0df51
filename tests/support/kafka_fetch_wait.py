"""
Test support only: make noida-db hold an empty Fetch as Kafka does (never loaded by the product).

Kafka (and Tansu) hold a Fetch that finds no records until ``fetch.min.bytes`` arrive or the
request's ``max_wait_time`` (``fetch.max.wait.ms``, 500 ms by default) runs out. noida-db 0.2.3
answers it at once and has no option to change that, so every aiokafka consumer on it spins: an
idle consumer sent ~6,000 Fetch requests a second and kept a core busy, in every Kafka test on
noida-db and in every triggerer of the e2e deployments.

:func:`install` wraps :meth:`aiokafka.client.AIOKafkaClient.send`: when a Fetch request with
``min_bytes`` > 0 comes back carrying no record bytes and no error, well before its
``max_wait_time``, the call waits the rest of that time, at most :data:`CAP` seconds, before it
returns the response. A record produced meanwhile is read at most ~100 ms late. On Tansu and Kafka
the broker has already waited, so nothing changes there. Fetches with data or an error, and every
other request, pass through untouched.

Loaded in the pytest process by ``tests/conftest.py`` (for every test), and in child processes
that get :data:`ENV` = ``1`` and :data:`SITE_DIR` on ``PYTHONPATH`` (:func:`child_python_path`):
that directory's ``sitecustomize`` installs the wrapper when ``aiokafka.client`` is first imported,
so a process that never uses Kafka imports nothing more. ``SHARED_STREAM_TEST_KAFKA_FETCH_WAIT=0``
in the environment of pytest turns it off (to measure the stand-in as it is).
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

ENV = "SHARED_STREAM_TEST_KAFKA_FETCH_WAIT"
"""``1``: child processes install the wrapper; ``0`` in pytest's environment: nobody does."""

CAP = 0.1
"""The longest one empty Fetch is held here, in seconds (the read delay it can add)."""

SITE_DIR = Path(__file__).resolve().parent / "kafka_fetch_wait_site"
"""Holds the ``sitecustomize`` that installs the wrapper in a child process."""

MARK = "_shared_stream_fetch_wait"
"""Set on the wrapper: one wrapper per process, however many copies of this module load it."""


def wanted() -> bool:
    """Whether this process's tests should run with the shim: on, unless :data:`ENV` is ``0``."""
    return os.environ.get(ENV, "1") != "0"


def enable_here_and_in_children() -> None:
    """Install the wrapper in this process, and have the child processes it starts install it too."""
    install()
    os.environ[ENV] = "1"
    os.environ["PYTHONPATH"] = child_python_path(os.environ.get("PYTHONPATH", ""))


def child_python_path(*entries: str | Path) -> str:
    """
    ``PYTHONPATH`` for a child process: ``entries`` (directories, or ``PYTHONPATH`` strings), then
    :data:`SITE_DIR` if the shim is on in this process.
    """
    paths = [p for e in entries for p in str(e).split(os.pathsep) if p]
    if os.environ.get(ENV) == "1" and str(SITE_DIR) not in paths:
        paths.append(str(SITE_DIR))
    return os.pathsep.join(paths)


def with_fetch_wait(env: dict[str, str]) -> dict[str, str]:
    """``env`` for a child process, with :data:`SITE_DIR` on its ``PYTHONPATH`` if the shim is on here."""
    if os.environ.get(ENV) == "1":
        env = {**env, ENV: "1", "PYTHONPATH": child_python_path(env.get("PYTHONPATH", ""))}
    return env


def _empty_and_clean(response: Any) -> bool:
    """True when a Fetch response carries no record bytes and no error code (any version)."""
    if getattr(response, "error_code", 0):  # v7+ request-level error
        return False
    for _topic, partitions in response.topics:
        for _partition, error_code, _highwater, *rest in partitions:
            if error_code or rest[-1]:  # the record set is the last field in every version
                return False
    return True


def install() -> None:
    """Wrap ``AIOKafkaClient.send`` in this process (idempotent)."""
    from aiokafka.client import AIOKafkaClient
    from aiokafka.protocol.fetch import FetchRequest

    if installed():
        return
    original = AIOKafkaClient.send

    async def send(self: Any, node_id: Any, request: Any, **kwargs: Any) -> Any:
        # aiokafka 0.14's FetchRequest keeps these; another aiokafka (a child process in another
        # virtual environment) passes through, and test_kafka_fetch_wait.py fails in ours.
        max_wait_ms = getattr(request, "_max_wait_ms", 0) if isinstance(request, FetchRequest) else 0
        if max_wait_ms <= 0 or getattr(request, "_min_bytes", 0) <= 0:
            return await original(self, node_id, request, **kwargs)
        loop = asyncio.get_running_loop()
        started = loop.time()
        response = await original(self, node_id, request, **kwargs)
        rest = min(CAP, max_wait_ms / 1000 - (loop.time() - started))
        if rest > 0.005 and _empty_and_clean(response):
            await asyncio.sleep(rest)
        return response

    send.__wrapped__ = original  # type: ignore[attr-defined]
    setattr(send, MARK, True)
    AIOKafkaClient.send = send  # type: ignore[method-assign]


def uninstall() -> None:
    """Put the original ``send`` back (to measure the stand-in as it is)."""
    from aiokafka.client import AIOKafkaClient

    if installed():
        AIOKafkaClient.send = AIOKafkaClient.send.__wrapped__  # type: ignore[attr-defined,method-assign]


def installed() -> bool:
    from aiokafka.client import AIOKafkaClient

    return bool(getattr(AIOKafkaClient.send, MARK, False))
