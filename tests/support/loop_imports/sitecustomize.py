"""
Which modules this provider's code imports on the trigger runner's event loop thread (issue 50).

On ``PYTHONPATH`` (imported at interpreter start), in an ``airflow triggerer`` process: an at-fork
hook installs, in each child the supervisor forks (its trigger runner), a ``sys.meta_path``
finder that records every module imported for the first time on that child's main thread (the
thread that forked, where the runner runs its event loop) while a frame of
``airflow_shared_stream`` is on the importing stack, i.e. an import our code caused on the loop.
Each is appended at once, as a JSON line (``{"module": ..., "via": "<file>:<line> <function>"}``,
``via`` the innermost frame of ours), to ``$LOOP_IMPORTS_OUT/<pid>.jsonl``, before the import
itself runs: whatever the runner reports afterwards (an asset event) comes after the line.

The finder finds nothing (it returns ``None``): the import goes on as it would have.
"""

from __future__ import annotations

import json
import os
import sys
import threading
from typing import Any

_OUT = os.environ.get("LOOP_IMPORTS_OUT")
_STARTED_IN = os.getpid()
_OURS = f"{os.sep}airflow_shared_stream{os.sep}"


class _LoopImportRecorder:
    """A meta path finder that writes down the imports our code makes on the main thread."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.main = threading.get_ident()
        self.pid = os.getpid()
        self.busy = False

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> None:
        if self.busy or threading.get_ident() != self.main or os.getpid() != self.pid:
            return None
        frame = sys._getframe(1)
        while frame is not None:
            filename = frame.f_code.co_filename
            if _OURS in filename:
                self.busy = True
                try:
                    via = f"{filename.split(_OURS, 1)[1]}:{frame.f_lineno} {frame.f_code.co_name}"
                    with open(self.path, "a") as fh:
                        fh.write(json.dumps({"module": name, "via": f"airflow_shared_stream/{via}"}) + "\n")
                finally:
                    self.busy = False
                return None
            frame = frame.f_back  # type: ignore[assignment]
        return None


def _in_child() -> None:
    # Only a triggerer supervisor's own children: its trigger runner (the dag-processor's parsing
    # children, and a fork of the runner's own, are not watched).
    if not _OUT or os.getppid() != _STARTED_IN or "triggerer" not in sys.argv:
        return
    path = os.path.join(_OUT, f"{os.getpid()}.jsonl")
    open(path, "a").close()  # the runner is watched, whether or not anything is recorded
    sys.meta_path.insert(0, _LoopImportRecorder(path))


if _OUT and hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_in_child)
