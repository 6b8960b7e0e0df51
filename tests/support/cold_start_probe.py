"""
Run in a fresh interpreter by tests/integration/sqs/test_sqs_cold_start.py: start an SQS stream
whose SDK is not imported yet, and print on which thread each SDK module was first imported.

Usage: python -m tests.support.cold_start_probe <queue_url>  (AIRFLOW_CONN_AWS_DEFAULT set)
"""

from __future__ import annotations

import asyncio
import json
import sys
import threading
from typing import Any

SDK_PREFIXES = ("aiobotocore", "botocore", "aiohttp")


class ImportThreads:
    """A meta path finder that only records which thread imports each SDK module first."""

    def __init__(self) -> None:
        self.on_loop: list[str] = []
        self.main = threading.get_ident()

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> None:
        if name.startswith(SDK_PREFIXES) and threading.get_ident() == self.main:
            self.on_loop.append(name)
        return None


async def main(queue_url: str) -> None:
    from airflow_shared_stream.sqs.trigger import SqsSharedStreamTrigger

    assert "aiobotocore.session" not in sys.modules, "the SDK is imported already"
    threads = ImportThreads()
    sys.meta_path.insert(0, threads)  # type: ignore[arg-type]
    trigger = SqsSharedStreamTrigger(queue_url)
    producer = SqsSharedStreamTrigger.create_shared_stream_producer(trigger.serialize()[1])
    stream = producer.open_stream()
    await asyncio.wait_for(stream.__anext__(), 120)
    await stream.aclose()
    await producer.aclose()
    print(json.dumps({"imported_on_the_loop": threads.on_loop}))


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1]))
