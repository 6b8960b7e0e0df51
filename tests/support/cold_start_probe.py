"""
Run in a fresh interpreter by tests/integration/sqs/test_sqs_cold_start.py: start an SQS stream
whose SDK is not imported yet, and print on which thread each SDK module was first imported, and
whether Airflow's metrics registry (a YAML file parsed on the first metric) was built on it.

Usage: python -m tests.support.cold_start_probe <queue_url>  (AIRFLOW_CONN_AWS_DEFAULT set)
"""

from __future__ import annotations

import asyncio
import json
import sys
import threading
from types import FrameType
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


REGISTRY_BUILDER = ("observability/metrics/metrics_registry.py", "read_metrics_yaml")


def registry_built_on_this_thread(seen: list[str]) -> Any:
    """A profile function recording each build of Airflow's metrics registry on its thread."""
    path, name = REGISTRY_BUILDER

    def profile(frame: FrameType, event: str, arg: Any) -> None:
        code = frame.f_code
        if event == "call" and code.co_name == name and code.co_filename.endswith(path):
            seen.append(f"{path}:{name}")

    return profile


def registry_built() -> bool:
    module = sys.modules.get("airflow._shared.observability.metrics.stats")
    return getattr(module, "_registry", None) is not None


async def main(queue_url: str) -> None:
    from airflow_shared_stream.sqs.trigger import SqsSharedStreamTrigger

    assert "aiobotocore.session" not in sys.modules, "the SDK is imported already"
    threads = ImportThreads()
    sys.meta_path.insert(0, threads)  # type: ignore[arg-type]
    registry_on_the_loop: list[str] = []
    sys.setprofile(registry_built_on_this_thread(registry_on_the_loop))
    trigger = SqsSharedStreamTrigger(queue_url)
    producer = SqsSharedStreamTrigger.create_shared_stream_producer(trigger.serialize()[1])
    stream = producer.open_stream()
    await asyncio.wait_for(stream.__anext__(), 120)
    await stream.aclose()
    await producer.aclose()
    sys.setprofile(None)
    found = {
        "imported_on_the_loop": threads.on_loop,
        "metrics_registry_on_the_loop": registry_on_the_loop,
        "metrics_registry_built": registry_built(),
    }
    print(json.dumps(found))


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1]))
