"""
The Streams page while a broker's operations take longer to import than the page's deadline
(a cold api-server on a loaded machine: the SDK's modules compiled from source).

FAULT_MODEL classes 7 and 13. Each stream of the page imports its broker's operations in
``asyncio.to_thread``; the deadline ends the wait, not the thread. Every other stream of the same
broker, and every later look at the page, started its own thread, which waits on Python's
import lock for the first one: the api-server's default executor (min(32, cpu + 4) threads, 6 on
2 cores) fills with threads doing nothing, and everything else the api-server runs in it (every
other broker's backlog, the SDK's DNS lookups) waits for the import too.

The import is held by an import-system finder that waits on an event while Python holds the
module's import lock, as a slow import does; the module is really imported when it is released.
"""

from __future__ import annotations

import asyncio
import importlib.abc
import sys
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

import airflow_shared_stream.sqs.operations  # noqa: F401 (the test un-imports it, then puts it back)
from airflow_shared_stream.console import backlog
from airflow_shared_stream.console.backlog import broker_backlog

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

MODULE = "airflow_shared_stream.sqs.operations"


class _SlowImport(importlib.abc.MetaPathFinder):
    def __init__(self) -> None:
        self.entered = threading.Event()
        self.release = threading.Event()

    def find_spec(self, name, path, target=None):
        if name == MODULE:
            self.entered.set()
            self.release.wait(120)
        return None


async def test_a_slow_broker_import_holds_one_worker_thread_however_many_looks(
    sqs, aws_connection, monkeypatch
) -> None:
    monkeypatch.setattr(backlog, "TIMEOUT_SECONDS", 0.3)
    monkeypatch.setattr(backlog, "CACHE_SECONDS", 0.0)
    executor = ThreadPoolExecutor(max_workers=6, thread_name_prefix="api-server")  # 2 cores
    asyncio.get_running_loop().set_default_executor(executor)
    url = sqs.create_queue()
    sqs.send(url, [{"n": 1}])
    package = sys.modules["airflow_shared_stream.sqs"]
    original = sys.modules.pop(MODULE)
    slow = _SlowImport()
    sys.meta_path.insert(0, slow)
    try:
        for _look in range(3):  # three looks at a page of four SQS streams, each past the deadline
            found = await asyncio.gather(*(broker_backlog("sqs", {"queue_url": url}) for _ in range(4)))
            assert all(f is not None and f["error"] == "TimeoutError" for f in found), found
        assert slow.entered.is_set()
        # Anything else the api-server runs in a worker thread still gets one.
        await asyncio.wait_for(asyncio.to_thread(lambda: None), 10)
        slow.release.set()
        # The import ends once released; the page's short deadline was for the looks above only.
        monkeypatch.setattr(backlog, "TIMEOUT_SECONDS", 60.0)
        found = await asyncio.wait_for(broker_backlog("sqs", {"queue_url": url}), 120)
        assert found is not None
        assert found["source"]["visible"] == 1, found
    finally:
        slow.release.set()
        sys.meta_path.remove(slow)
        sys.modules[MODULE] = original
        package.operations = original  # type: ignore[attr-defined]
        executor.shutdown(wait=True)
