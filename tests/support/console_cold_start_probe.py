"""
Run in a fresh interpreter by tests/integration/sqs/test_sqs_console_liveness.py: read an SQS
stream's backlog as the Streams page does, with no broker SDK imported yet, and print the answer
and which SDK modules the event loop's own thread imported.

Usage: python -m tests.support.console_cold_start_probe <queue_url>  (AIRFLOW_CONN_AWS_DEFAULT set)
"""

from __future__ import annotations

import asyncio
import json
import sys

from tests.support.cold_start_probe import ImportThreads


async def main(queue_url: str) -> None:
    from airflow_shared_stream.console import backlog
    from airflow_shared_stream.console.backlog import broker_backlog

    # What is checked is where the SDK is imported, not how fast: no bound may end the read.
    backlog.TIMEOUT_SECONDS = 3600.0

    assert "aiobotocore" not in sys.modules, "the SDK is imported already"
    threads = ImportThreads()
    sys.meta_path.insert(0, threads)  # type: ignore[arg-type]
    found = await broker_backlog("sqs", {"queue_url": queue_url, "aws_conn_id": "aws_default"})
    print(json.dumps({"backlog": found, "imported_on_the_loop": threads.on_loop}))


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1]))
