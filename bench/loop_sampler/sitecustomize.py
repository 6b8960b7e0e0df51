"""
A stack sampler for the trigger runner's event loop (``bench/startup.py --sample-loop DIR``).

The runner is a forked child of the triggerer's supervisor, so this module (on ``PYTHONPATH``,
imported at interpreter start) registers an at-fork hook: in every forked child, a thread
samples the forking thread's stack every few milliseconds. Written to
``$LOOP_SAMPLER_OUT/<pid>.txt``:

* a run of samples in which that thread was not waiting in the selector (the loop is busy)
  lasting longer than the threshold, stacks counted;
* a late wake-up of the sampler itself (something held the interpreter, or the process was not
  scheduled), with each thread's CPU time over the gap and every thread's stack after it;
* every garbage collection longer than a few milliseconds: generation, duration, thread.

Diagnosis only: the sampler takes the interpreter from the loop for each sample
(``LOOP_SAMPLER_PERIOD=0`` keeps only the collections and the loop's CPU, without the thread).
"""

from __future__ import annotations

import collections
import gc
import os
import sys
import threading
import time
from typing import Any

_OUT = os.environ.get("LOOP_SAMPLER_OUT")
_PERIOD = float(os.environ.get("LOOP_SAMPLER_PERIOD", "0.01"))
_THRESHOLD = float(os.environ.get("LOOP_SAMPLER_THRESHOLD", "0.15"))
_LATE = 0.06
_GC_REPORTED = 0.005


def _write(text: str) -> None:
    if _OUT:
        with open(os.path.join(_OUT, f"{os.getpid()}.txt"), "a") as fh:
            fh.write(text + "\n")


def _stamp(epoch: float) -> str:
    return time.strftime("%H:%M:%S", time.gmtime(epoch)) + f".{int(epoch % 1 * 1000):03d}"


def _waiting(frame: object) -> bool:
    """Whether the sampled thread is parked in the selector (the loop is idle)."""
    code = getattr(frame, "f_code", None)
    return code is not None and code.co_filename.endswith("selectors.py")


def _stack(frame: Any) -> tuple[str, ...]:
    """The frames, outermost first, without reading source lines (cheap: the loop waits meanwhile)."""
    stack = []
    while frame is not None:
        stack.append(f"{frame.f_code.co_filename}:{frame.f_lineno} {frame.f_code.co_name}")
        frame = frame.f_back
    return tuple(reversed(stack))


def _thread_cpu() -> dict[int, float]:
    """Native thread id -> CPU seconds, from ``/proc``."""
    cpu = {}
    tick = os.sysconf("SC_CLK_TCK")
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/stat") as fh:
                fields = fh.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        cpu[int(tid)] = (int(fields[11]) + int(fields[12])) / tick
    return cpu


def _names() -> dict[int, str]:
    return {t.native_id or 0: t.name for t in threading.enumerate()}


def _sample(ident: int) -> None:
    try:
        _sample_until_gone(ident)
    except BaseException as exc:  # a diagnosis tool: say why it stopped
        _write(f"=== sampler stopped: {exc!r}")
        raise


def _sample_until_gone(ident: int) -> None:
    _write(f"=== sampling {sys.argv[:3]} thread {ident}")
    run: list[tuple[float, tuple[str, ...]]] = []
    cpu_before = _thread_cpu()
    while True:
        slept_at = time.monotonic()
        time.sleep(_PERIOD)
        late = time.monotonic() - slept_at - _PERIOD
        frames = sys._current_frames()
        frame = frames.get(ident)
        if frame is None:
            return
        now = time.time()
        cpu_now = _thread_cpu()
        if late > _LATE:
            names = _names()
            spent = {
                f"{names.get(tid, '?')}[{tid}]": round(cpu_now.get(tid, 0.0) - before, 3)
                for tid, before in cpu_before.items()
                if cpu_now.get(tid, 0.0) - before > 0
            }
            lines = [f"=== late wake-up at {_stamp(now)} UTC by {late:.3f} s; thread CPU over it: {spent}"]
            by_ident = {t.ident: t.name for t in threading.enumerate()}
            for thread_ident, thread_frame in frames.items():
                if thread_ident == threading.get_ident():
                    continue
                lines.append(f"--- thread {by_ident.get(thread_ident, thread_ident)}")
                lines.extend(f"    {line}" for line in _stack(thread_frame)[-25:])
            _write("\n".join(lines))
        cpu_before = cpu_now
        if not _waiting(frame):
            run.append((now, _stack(frame)))
            continue
        if run and run[-1][0] - run[0][0] >= _THRESHOLD:
            _dump(run)
        run = []


def _dump(run: list[tuple[float, tuple[str, ...]]]) -> None:
    counts = collections.Counter(stack for _, stack in run)
    lines = [
        f"=== busy run from {_stamp(run[0][0])} UTC for {run[-1][0] - run[0][0]:.3f} s, {len(run)} samples"
    ]
    for stack, count in counts.most_common():
        lines.append(f"--- {count} samples")
        lines.extend(f"    {line}" for line in stack[-40:])
    _write("\n".join(lines))


_gc_started: list[float] = []


def _on_gc(phase: str, info: dict[str, int]) -> None:
    if phase == "start":
        _gc_started[:] = [time.perf_counter()]
        return
    if not _gc_started:
        return
    took = time.perf_counter() - _gc_started[0]
    if took >= _GC_REPORTED:
        _write(
            f"=== gc generation {info.get('generation')} at {_stamp(time.time())} UTC took {took:.3f} s "
            f"in thread {threading.current_thread().name}; collected {info.get('collected')}"
        )


_CPU_REPORTED = 0.03
_steps: list[tuple[float, str]] = []


def _what(handle: Any) -> str:
    """The coroutine a task step ran and where it stopped, else the callback."""
    task = getattr(handle._callback, "__self__", None)
    coro = task.get_coro() if hasattr(task, "get_coro") else None
    if coro is None:
        return repr(handle._callback)[:200]
    where = []
    while coro is not None:
        frame = getattr(coro, "cr_frame", None) or getattr(coro, "ag_frame", None)
        if frame is not None:
            where.append(
                f"{frame.f_code.co_filename.rsplit('/', 2)[-1]}:{frame.f_lineno} {frame.f_code.co_name}"
            )
        coro = getattr(coro, "cr_await", None) or getattr(coro, "ag_await", None)
    return " > ".join(where[-6:]) or getattr(task, "get_name", lambda: "?")()


def _time_the_loop() -> None:
    """The loop thread's CPU per iteration and per callback: its own work, whatever the machine's load."""
    import asyncio.base_events
    import asyncio.events

    run_once = asyncio.base_events.BaseEventLoop._run_once
    handle_run = asyncio.events.Handle._run

    def timed_run(handle: Any) -> None:
        cpu = time.thread_time()
        try:
            handle_run(handle)
        finally:
            spent = time.thread_time() - cpu
            if spent >= 0.005:
                _steps.append((spent, _what(handle)))

    def timed_run_once(loop: Any) -> None:
        _steps.clear()
        cpu, wall = time.thread_time(), time.perf_counter()
        run_once(loop)
        spent = time.thread_time() - cpu
        if spent >= _CPU_REPORTED:
            steps = "; ".join(f"{t * 1000:.0f} ms {what}" for t, what in sorted(_steps, reverse=True)[:6])
            _write(
                f"=== loop iteration at {_stamp(time.time())} UTC: {spent * 1000:.0f} ms CPU on the loop "
                f"thread, {(time.perf_counter() - wall) * 1000:.0f} ms wall; steps: {steps}"
            )

    asyncio.events.Handle._run = timed_run  # type: ignore[method-assign]
    asyncio.base_events.BaseEventLoop._run_once = timed_run_once  # type: ignore[method-assign]


def _after_fork_in_child() -> None:
    if _OUT:
        ident = threading.get_ident()
        gc.callbacks.append(_on_gc)
        _time_the_loop()
        if _PERIOD <= 0:  # the collections and the loop's CPU only: no thread to perturb the runner
            _write(f"=== timing the loop of {sys.argv[:3]}, no stack sampling")
            return
        threading.Thread(target=_sample, args=(ident,), name="loop-sampler", daemon=True).start()


if _OUT and hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
