"""
What the triggerer's supervisor does around forking its trigger runner.

Airflow's triggerer forks its trigger runner from the supervisor process
(``TriggerRunnerSupervisor.start``: a bare ``os.fork`` on Linux), so the runner starts with
whatever the supervisor had imported. Two consequences for this provider:

* **Imports.** A stream imports its producer module and its broker SDK in a worker thread when it
  opens (``common.off_loop``), to keep them off the runner's event loop. On a loaded machine that
  was not enough: the importing thread took the interpreter from the loop for seconds, and the
  loop answered nothing meanwhile (docs/benchmarks.rst). Imported in the supervisor just before
  the fork, once, the producers of the installed brokers cost the runner nothing. Importing starts
  no thread in any of the four SDKs (gRPC's core starts with its first channel), so the fork
  copies no half-started client. Airflow's metrics registry is built then too (a YAML parse the
  first metric would otherwise pay in the runner); its stats backend is not, since an
  OpenTelemetry backend starts an exporter thread that a fork would leave behind.
* **Threads.** A thread importing modules while the process forks leaves the child a module lock
  that nobody will release: the runner would hang at its first import of that module. The
  provider's supervisor threads (the Execution API warm-up, the placement check) therefore wait
  for :data:`runner_forked` before they do anything.

Both hooks are registered once per process by this provider's listener, act only in a triggerer
job's process, and never raise: a failed import is the stream's to report when it opens.
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import os
import threading
import time
from typing import Any

log = logging.getLogger(__name__)

STREAM_PRODUCERS = (
    "airflow_shared_stream.kafka.producer:KafkaSharedStreamProducer",
    "airflow_shared_stream.sqs.producer:SqsSharedStreamProducer",
    "airflow_shared_stream.pubsub.producer:PubSubSharedStreamProducer",
    "airflow_shared_stream.servicebus.producer:ServiceBusSharedStreamProducer",
)
"""What a stream imports when it opens: its producer's module, then the producer's ``sdk_modules``."""

runner_forked = threading.Event()
"""Set in a triggerer's supervisor once it has forked its trigger runner."""

_jobs: list[Any] = []
_hooks_registered = False
_lock = threading.Lock()


def watch(job: Any) -> None:
    """Register the fork hooks for ``job``'s process (a listener's ``on_starting``; any job type)."""
    global _hooks_registered
    with _lock:
        _jobs.append(job)
        if not _hooks_registered and hasattr(os, "register_at_fork"):
            os.register_at_fork(before=_before_fork, after_in_parent=_after_fork_in_parent)
            _hooks_registered = True


def _in_triggerer() -> bool:
    # Read from the instance's __dict__: never an ORM load, not in a fork hook.
    return any(vars(job).get("job_type") == "TriggererJob" for job in _jobs)


def _before_fork() -> None:
    if runner_forked.is_set() or not _in_triggerer():
        return
    with contextlib.suppress(Exception):
        preload_stream_modules()


def _after_fork_in_parent() -> None:
    if _in_triggerer():
        runner_forked.set()


def preload_stream_modules() -> list[str]:
    """Import the installed brokers' producer modules and build the metrics registry; what was imported."""
    started = time.monotonic()
    loaded = []
    for path in STREAM_PRODUCERS:
        name, _, class_name = path.partition(":")
        try:
            producer = getattr(importlib.import_module(name), class_name)
            for sdk_module in getattr(producer, "sdk_modules", ()):
                importlib.import_module(sdk_module)
        except ImportError:  # that broker's extra is not installed
            continue
        except Exception as exc:  # a broken SDK: the stream that needs it says so when it opens
            log.info("Not importing %s before the trigger runner starts (%s)", name, type(exc).__name__)
            continue
        loaded.append(name)
    from airflow_shared_stream.common.metrics import warm_up_metrics_registry

    warm_up_metrics_registry()
    log.info(
        "Imported the streams of %s for the trigger runner in %.1f s",
        ", ".join(name.split(".")[1] for name in loaded) or "no broker",
        time.monotonic() - started,
    )
    return loaded
