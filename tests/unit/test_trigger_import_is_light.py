"""
Importing a trigger class imports no broker SDK (issue 50, FAULT_MODEL class 13).

Airflow's ``TriggerRunner`` imports each trigger's classpath synchronously on its event loop,
which every trigger of the triggerer shares. A broker SDK imported with the trigger class
(hundreds of modules) held that loop 0.2-0.5 s on a loaded machine at each stream's start. The
streams import their SDK in a worker thread before connecting instead. Each check imports one
trigger module in a fresh interpreter and lists the SDK modules that were imported: an event,
not a timing, so it holds on a loaded machine.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

SDKS: dict[str, tuple[str, ...]] = {
    "kafka": ("aiokafka",),
    "sqs": ("aiobotocore", "botocore", "aiohttp"),
    "pubsub": ("google.pubsub_v1", "google.cloud.pubsub_v1", "google.api_core", "grpc"),
    "servicebus": ("azure.servicebus",),
}
"""Per broker: the SDK packages a trigger class must not import."""

PROBE = """
import json, sys
import airflow.triggers.base  # what the trigger runner has imported already
import airflow_shared_stream.{broker}.trigger
print(json.dumps(sorted(name for name in sys.modules if name.split(".")[0] in {tops!r}
                        and any(name == p or name.startswith(p + ".") for p in {sdks!r}))))
"""


def imported_sdk_modules(broker: str) -> list[str]:
    """The SDK modules a fresh interpreter holds after importing ``broker``'s trigger module."""
    sdks = SDKS[broker]
    tops = sorted({name.split(".")[0] for name in sdks})
    done = subprocess.run(
        [sys.executable, "-c", PROBE.format(broker=broker, tops=tops, sdks=sdks)],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    modules: list[str] = json.loads(done.stdout.strip().splitlines()[-1])
    return modules


@pytest.mark.parametrize("broker", sorted(SDKS))
def test_importing_a_trigger_class_imports_no_broker_sdk(broker: str) -> None:
    imported = imported_sdk_modules(broker)
    assert not imported, (
        f"importing airflow_shared_stream.{broker}.trigger imported its SDK on the runner's loop: "
        f"{imported[:8]} ({len(imported)} modules)"
    )


TRIGGERS: dict[str, str] = {
    "kafka": "KafkaSharedStreamTrigger(['orders'])",
    "sqs": "SqsSharedStreamTrigger('https://sqs.us-east-1.amazonaws.com/123456789012/orders')",
    "pubsub": "PubSubSharedStreamTrigger('orders')",
    "servicebus": "ServiceBusSharedStreamTrigger(queue_name='orders')",
}
"""Per broker: a watcher's trigger (Pub/Sub's project and Service Bus's namespace from its connection)."""

CONNECTIONS = {
    "AIRFLOW_CONN_GOOGLE_CLOUD_DEFAULT": json.dumps(
        {"conn_type": "google_cloud_platform", "extra": {"project": "demo-project"}}
    ),
    "AIRFLOW_CONN_AZURE_SERVICE_BUS_DEFAULT": json.dumps(
        {
            "conn_type": "azure_service_bus",
            "schema": "Endpoint=sb://127.0.0.1:5672;SharedAccessKeyName=a;SharedAccessKey=b;"
            "UseDevelopmentEmulator=true;",
        }
    ),
}
"""The connections the stream keys read (on the triggerer's loop): reading them imports no SDK."""

OPENING = """
import asyncio, importlib, json, sys, threading, traceback
found_in = {{}}

class WhereImported:
    def find_spec(self, name, path=None, target=None):
        finding_only = any(f.name == "require_sdk" for f in traceback.extract_stack(limit=6))
        if name in {sdks!r} and not finding_only:  # require_sdk finds it, without importing
            found_in.setdefault(name, threading.current_thread() is threading.main_thread())
        return None

sys.meta_path.insert(0, WhereImported())
from airflow_shared_stream.common.off_loop import ImportedOffLoop, import_off_loop
from airflow_shared_stream.{broker}.trigger import *
from airflow_shared_stream.common.figures import stream_figures
trigger = {trigger}
trigger.trigger_id, trigger.asset_state_store = 1, object()  # as the triggerer runs a watcher
with stream_figures.watching(trigger):  # what a watcher's filter does first, on the loop
    pass
producer = type(trigger).create_shared_stream_producer(trigger.serialize()[1])
assert isinstance(producer, ImportedOffLoop), type(producer)
before = sorted(found_in)
build = producer._build

def build_not_connecting():  # the stream as built; opening imports its SDK, then yields (no broker)
    built = build()
    async def opened():
        await import_off_loop(getattr(built, "sdk_modules", ()))  # as a leased queue's open_stream
        yield ("opened", None)
    built.open_stream = opened
    return built

producer._build = build_not_connecting

async def open_it():
    stream = producer.open_stream()
    first = await stream.__anext__()
    await stream.aclose()
    return first

assert asyncio.run(open_it())[0] == "opened"
print(json.dumps({{"before": before, "on_main_thread": found_in}}))
"""


@pytest.mark.parametrize("broker", sorted(SDKS))
def test_a_stream_imports_its_producer_and_sdk_in_a_worker_thread(broker: str) -> None:
    """The producer Airflow builds on the loop imports its module (and SDK) off it, when it opens."""
    sdks = [name for name in SDKS[broker] if "." not in name] + [SDKS[broker][0]]
    done = subprocess.run(
        [sys.executable, "-c", OPENING.format(broker=broker, trigger=TRIGGERS[broker], sdks=sdks)],
        cwd=REPO,
        env={**os.environ, **CONNECTIONS},
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["before"] == [], f"a watcher's start or its producer imported {seen['before']} on the loop"
    assert seen["on_main_thread"], "opening the stream imported no SDK"
    on_loop = [name for name, main in seen["on_main_thread"].items() if main]
    assert not on_loop, f"imported on the event loop's thread: {on_loop}"


@pytest.mark.parametrize("broker", sorted(SDKS))
def test_a_watcher_labels_its_stream_as_the_producer_will(broker: str) -> None:
    """The label a watcher gives its stream's figures before the producer exists is the producer's."""
    import importlib

    from airflow_shared_stream.common.figures import metric_label
    from airflow_shared_stream.common.metric_names import stream_label

    trigger_module = importlib.import_module(f"airflow_shared_stream.{broker}.trigger")
    trigger = eval(TRIGGERS[broker], vars(trigger_module))
    assert stream_label(trigger.metrics_stream_name()) == metric_label(trigger)


PRODUCERS: dict[str, tuple[str, str]] = {
    "kafka": ("KafkaSharedStreamTrigger", "airflow_shared_stream.kafka.producer:KafkaSharedStreamProducer"),
    "sqs": ("SqsSharedStreamTrigger", "airflow_shared_stream.sqs.producer:SqsSharedStreamProducer"),
    "pubsub": (
        "PubSubSharedStreamTrigger",
        "airflow_shared_stream.pubsub.producer:PubSubSharedStreamProducer",
    ),
    "servicebus": (
        "ServiceBusSharedStreamTrigger",
        "airflow_shared_stream.servicebus.producer:ServiceBusSharedStreamProducer",
    ),
}


@pytest.mark.parametrize("broker", sorted(PRODUCERS))
def test_a_trigger_class_still_names_its_producer_class(broker: str) -> None:
    """
    ``Trigger.producer_class`` is still the stream's producer class where code reads it (attack on
    issue 50). It read ``None`` on the shipped triggers once they named their producer by path:
    the contract suite's SQS and Service Bus lease and close tests failed on it
    (``monkeypatch.setattr(trigger.producer_class, ...)``), or silently patched nothing
    (``hasattr(trigger.producer_class, ...)``), and so would a user's subclass that derives
    its producer from ``Trigger.producer_class``. Reading it imports the producer there, in
    the reader's thread; the triggerer's own paths never read it.
    """
    import importlib

    trigger_name, path = PRODUCERS[broker]
    trigger_class = getattr(importlib.import_module(f"airflow_shared_stream.{broker}.trigger"), trigger_name)
    module, _, name = path.partition(":")
    assert trigger_class.producer_class is getattr(importlib.import_module(module), name)
