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
  copies no half-started client. So are the Task SDK's modules a stream's first connection read
  imports lazily (:data:`STREAM_START_MODULES`): imported there, in every broker's hook, the
  first of them (``Connection``, an attrs class) held the runner's loop a quarter of a second
  on a loaded machine. Airflow's metrics registry is built then too (a YAML parse the
  first metric would otherwise pay in the runner); its stats backend is not, since an
  OpenTelemetry backend starts an exporter thread that a fork would leave behind.
* **Threads.** A thread importing modules while the process forks leaves the child a module lock
  that nobody will release: the runner would hang at its first import of that module. The
  provider's supervisor thread (the placement check) therefore waits for :data:`runner_forked`
  before it does anything, and the Execution API warm-up runs in the hook itself, on the main
  thread (:mod:`.execution_api_warmup`; its one request in a thread joined before the hook
  returns).

* **The collector.** The runner's first full garbage collection, set off by a stream's first
  allocations (its client, its SDK's models), walked every object the supervisor had at the
  fork: Airflow's modules and the preloaded SDKs, a few hundred thousand objects, on the loop.
  The supervisor freezes its heap just before the fork (``gc.freeze``, as Airflow's
  LocalExecutor does before it forks its workers) and unfreezes it just after, in itself only:
  the runner keeps those objects out of its collections, the supervisor's collector is as it was.

In the runner (the child) they are inert: it inherits the supervisor's state, and a fork of its
own (a trigger using ``multiprocessing``'s fork context) must neither build an Execution API on
its event loop nor unfreeze the heap it inherited.

The hooks are registered once per process by this provider's listener, act only in a triggerer
job's process, and never raise: a failed import is the stream's to report when it opens.

A stop signal during the imports is not lost. CPython reports an exception that leaves an
at-fork hook as "unraisable" and forks anyway, and Airflow's SIGTERM/SIGINT handler raises
``SystemExit`` while the runner does not exist yet: run inside the imports, it was dropped and
the triggerer ran on as though never told to stop (the imports take seconds on a loaded
machine). While they run, those signals end the imports and are kept; once the fork is done and
the supervisor's main thread is out of the hooks, a thread sends them again, and Airflow's own
handler acts on them.

The job's heartbeat goes on meanwhile (:mod:`.warmup_heartbeat`): Airflow's supervisor loop,
which sends it, starts only after the fork, and the warm-up took 30 s on a loaded machine, long
enough for the triggerer to look dead to its health check and to other triggerers.
"""

from __future__ import annotations

import contextlib
import gc
import importlib
import logging
import os
import signal
import sys
import threading
import time
from typing import Any

from airflow_shared_stream import warmup_heartbeat
from airflow_shared_stream.execution_api_warmup import warm_up_before_fork

log = logging.getLogger(__name__)

STREAM_PRODUCERS = (
    "airflow_shared_stream.kafka.producer:KafkaSharedStreamProducer",
    "airflow_shared_stream.sqs.producer:SqsSharedStreamProducer",
    "airflow_shared_stream.pubsub.producer:PubSubSharedStreamProducer",
    "airflow_shared_stream.servicebus.producer:ServiceBusSharedStreamProducer",
)
"""What a stream imports when it opens: its producer's module, then the producer's ``sdk_modules``."""

STREAM_START_MODULES = (
    "airflow.sdk.definitions.connection",
    "airflow.sdk.execution_time.cache",
)
"""
What every broker's hook imports through Airflow at a stream's first connection read
(``BaseHook.aget_connection``, and ``get_connection``): found imported on the runner's loop by
tests/integration/test_stream_start_imports_nothing_on_the_loop.py. Neither starts a thread.
"""

runner_forked = threading.Event()
"""Set in a triggerer's supervisor once it has forked its trigger runner."""

_jobs: list[Any] = []
_hooks_registered = False
_lock = threading.Lock()
_kept_signals: list[int] = []
_importing = False
_froze_heap = False
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)
"""What Airflow's jobs handle to stop; kept while the imports run, sent again after the fork."""


class _StopRequested(BaseException):
    """A stop signal came during the imports: they end, and the signal is sent again after the fork."""


def _keep(signum: int, frame: Any) -> None:
    _kept_signals.append(signum)
    if _importing:
        raise _StopRequested


def watch(job: Any) -> None:
    """Register the fork hooks for ``job``'s process (a listener's ``on_starting``; any job type)."""
    global _hooks_registered
    with _lock:
        _jobs.append(job)
        if not _hooks_registered and hasattr(os, "register_at_fork"):
            os.register_at_fork(
                before=_before_fork,
                after_in_parent=_after_fork_in_parent,
                after_in_child=_after_fork_in_child,
            )
            _hooks_registered = True


def _in_triggerer() -> bool:
    return _triggerer_job() is not None


def _triggerer_job() -> Any:
    # Read from the instance's __dict__: never an ORM load, not in a fork hook.
    return next((job for job in _jobs if vars(job).get("job_type") == "TriggererJob"), None)


def _before_fork() -> None:
    if runner_forked.is_set() or not _in_triggerer():
        return
    if threading.current_thread() is not threading.main_thread():
        return  # Airflow forks its runner from the main thread: the only one that may set handlers
    global _importing, _froze_heap
    _kept_signals.clear()  # a runner that forks in turn inherited its supervisor's list
    handlers = {signum: signal.signal(signum, _keep) for signum in STOP_SIGNALS}
    _importing = True
    warmup_heartbeat.beat_for(_triggerer_job())
    try:
        with contextlib.suppress(Exception):
            preload_stream_modules()
        warm_up_before_fork()
    except _StopRequested:
        pass
    finally:
        warmup_heartbeat.beat_for(None)
        _importing = False
        for signum, handler in handlers.items():
            if handler is not None:
                signal.signal(signum, handler)
        # Last, so that the imports' objects are frozen too; a heap someone froze already
        # (a runner forking in turn) is theirs to unfreeze.
        if gc.get_freeze_count() == 0:
            gc.freeze()
            _froze_heap = True


def _after_fork_in_parent() -> None:
    global _froze_heap
    if not _in_triggerer():
        return
    if _froze_heap:
        gc.unfreeze()
        _froze_heap = False
    runner_forked.set()
    if _kept_signals:
        kept = list(_kept_signals)
        _kept_signals.clear()
        threading.Thread(
            target=_send_again, args=(kept,), name="shared-stream-stop-signal", daemon=True
        ).start()


def _after_fork_in_child() -> None:
    """The runner: its supervisor's hooks are done; a fork of the runner's own is not theirs."""
    global _froze_heap
    if not _in_triggerer():
        return
    # Without this the runner, which inherits the supervisor's state, ran the imports and built a
    # second Execution API on its event loop at a fork of its own (a trigger using
    # multiprocessing's fork context), then unfroze the heap it inherited.
    runner_forked.set()
    _froze_heap = False


def _send_again(signums: list[int]) -> None:
    """
    Send the kept signals once the main thread has left the fork hooks (where they would be lost)
    and Airflow's ``TriggerRunnerSupervisor.start`` (where Airflow's handler, the triggerer's runner
    not set yet, takes a first signal for a second one and forces the triggerer out).
    """
    hooks = {_before_fork.__code__, _after_fork_in_parent.__code__, *_supervisor_start_code()}
    main = threading.main_thread().ident
    while True:
        frame = sys._current_frames().get(main or 0)
        while frame is not None and frame.f_code not in hooks:
            frame = frame.f_back
        if frame is None:
            break
        time.sleep(0.01)
    for signum in signums:
        os.kill(os.getpid(), signum)


def _supervisor_start_code() -> list[Any]:
    runner = getattr(sys.modules.get("airflow.jobs.triggerer_job_runner"), "TriggerRunnerSupervisor", None)
    code = getattr(getattr(getattr(runner, "start", None), "__func__", None), "__code__", None)
    return [code] if code is not None else []


def preload_stream_modules() -> list[str]:
    """
    Import the installed brokers' producer modules, what a stream's first connection read imports,
    and build the metrics registry; the producers imported.
    """
    started = time.monotonic()
    loaded = []
    for path in STREAM_PRODUCERS:
        warmup_heartbeat.beat()  # each broker's imports take seconds on a loaded machine
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
    for name in STREAM_START_MODULES:
        try:
            importlib.import_module(name)
        except Exception as exc:  # the stream's own connection read reports it
            log.info("Not importing %s before the trigger runner starts (%s)", name, type(exc).__name__)
    from airflow_shared_stream.common.metrics import warm_up_metrics_registry

    warmup_heartbeat.beat()
    warm_up_metrics_registry()
    log.info(
        "Imported the streams of %s for the trigger runner in %.1f s",
        ", ".join(name.split(".")[1] for name in loaded) or "no broker",
        time.monotonic() - started,
    )
    return loaded
