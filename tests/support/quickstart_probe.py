"""
Run in a deployment virtualenv with ``python -I`` (the checkout NOT on sys.path): what a user sees.

``python quickstart_probe.py DAG_FILE QUEUE_URL`` parses the quickstart Dag with Airflow's
DagBag, rebuilds its watcher's trigger pointed at ``QUEUE_URL`` and runs it through the
installed package's SharedStreamHarness (Airflow's real shared-stream manager) until the first
trigger event. It also records what the package says without the Spark provider. Prints one line
of JSON (Airflow may log to stdout before it).
"""

from __future__ import annotations

import asyncio
import json
import runpy
import sys
from typing import Any


def parse(dag_file: str) -> dict[str, Any]:
    from airflow.dag_processing.dagbag import DagBag

    bag = DagBag(dag_folder=dag_file, safe_mode=False)
    errors = {path: str(error) for path, error in bag.import_errors.items()}
    return {"dag_ids": sorted(bag.dag_ids), "import_errors": errors}


async def first_event(dag_file: str, queue_url: str) -> dict[str, Any]:
    from airflow_shared_stream.sqs import SqsSharedStreamTrigger
    from airflow_shared_stream.testing import SharedStreamHarness

    [watcher] = runpy.run_path(dag_file)["orders"].watchers
    classpath, kwargs = watcher.trigger.serialize()
    trigger = SqsSharedStreamTrigger(**{**kwargs, "queue_url": queue_url})
    async with SharedStreamHarness(confirm_after=0.0) as harness:
        running = harness.add(trigger)
        [event] = await running.wait_for_events(1, timeout=60)
    return {"classpath": classpath, "payload": event.payload}


def spark_without_provider() -> dict[str, Any]:
    import importlib

    result: dict[str, Any] = {}
    for module in ("airflow_shared_stream.spark.operators", "airflow_shared_stream.spark.triggers"):
        try:
            importlib.import_module(module)
            result[module] = None
        except ImportError as exc:
            result[module] = str(exc)
    return result


def registered_providers() -> list[str]:
    from airflow.providers_manager import ProvidersManager

    return sorted(ProvidersManager().providers)


def main() -> None:
    dag_file, queue_url = sys.argv[1:3]
    report = {
        "parsed": parse(dag_file),
        "providers": registered_providers(),
        "spark": spark_without_provider(),
        "event": asyncio.run(first_event(dag_file, queue_url)),
    }
    print(json.dumps(report, default=str))


if __name__ == "__main__":
    main()
