"""
Run one redrive in a child process that stops for good between the copy and the removal.

The parent (:func:`kill_between_copy_and_remove`) waits for the child's ``COPIED`` line, written
once the broker accepted the first batch's copies and before any of them leaves the dead-letter
source, and SIGKILLs it there: a deterministic window, no sleep.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
READY = "COPIED"


async def _run(spec: dict[str, Any]) -> None:
    from airflow_shared_stream.common.redrive import RedriveItem, redrive
    from airflow_shared_stream.redrive import dead_letter_source

    async def stop_after_copy(step: str, items: Sequence[RedriveItem]) -> None:
        if step != "copied":
            return
        print(f"{READY} {len(items)}", flush=True)
        await asyncio.Event().wait()  # until the parent's SIGKILL

    source = dead_letter_source(spec["broker"], **spec["source"])
    checkpoint: Any = stop_after_copy
    if spec.get("stop_after") == "append":  # Kafka: skipped records appended again, not committed past
        append_again = source._append_again

        async def stop_after_append(skipped: Sequence[RedriveItem]) -> None:
            await append_again(skipped)
            print(f"{READY} {len(skipped)}", flush=True)
            await asyncio.Event().wait()  # until the parent's SIGKILL

        source._append_again = stop_after_append
        checkpoint = None
    await redrive(
        source, checkpoint=checkpoint, batch_size=spec.get("batch_size", 10), filter=spec.get("filter")
    )
    print("FINISHED", flush=True)


def kill_between_copy_and_remove(
    broker: str, timeout: float = 120.0, *, run: dict[str, Any] | None = None, **source: Any
) -> str:
    """
    Start the child, SIGKILL it at the checkpoint; return the line it printed (``COPIED <n>``).

    ``run``: ``filter``, and ``stop_after="append"`` to stop a Kafka redrive once it appended the
    skipped records again, before it commits past them.
    """
    spec = {"broker": broker, "source": source, **(run or {})}
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    child = subprocess.Popen(
        [sys.executable, "-m", "tests.support.redrive_child", json.dumps(spec)],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    lines: list[str] = []
    reached = threading.Event()

    def read() -> None:
        assert child.stdout is not None
        for line in child.stdout:
            lines.append(line.rstrip())
            if line.startswith(READY):
                reached.set()
                return

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        if not reached.wait(timeout):
            raise AssertionError("the redrive child never reached its checkpoint:\n" + "\n".join(lines[-40:]))
        os.kill(child.pid, signal.SIGKILL)
    finally:
        if child.poll() is None:
            child.kill()
        child.wait(timeout=30)
    return lines[-1]


if __name__ == "__main__":
    asyncio.run(_run(json.loads(sys.argv[1])))
