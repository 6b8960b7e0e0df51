#!/usr/bin/env python3
"""
A Python launcher for Spark drivers that dies with its parent JVM.

Why this exists: on a Spark standalone cluster a Python application's driver is two processes,
the ``DriverWrapper`` JVM started by the worker and the ``python`` process that JVM starts
(``PythonRunner``). When the driver is killed (REST ``kill``, a task deadline, ``on_kill``) the
worker stops the JVM, but nothing stops its Python child: it keeps running, holding memory
and possibly writing output, after Airflow was told the application is dead.

Point ``spark.pyspark.driver.python`` at this launcher. It asks Linux to send it ``SIGKILL``
when its parent dies (``prctl(PR_SET_PDEATHSIG)``), then ``exec``\\ s the real interpreter,
which keeps the setting (it survives ``execve`` for non-setuid programs). The interpreter
is, in order: ``$SPARK_PDEATHSIG_PYTHON`` (REST submissions only forward ``SPARK_*``
variables, hence the name), else the interpreter running this launcher.

It uses the standard library only, so it can be copied to Spark nodes that do not have this
provider installed; with the provider installed it is also the console script
``airflow-shared-stream-driver-python``.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import signal
import sys

PR_SET_PDEATHSIG = 1
REAL_PYTHON_ENV = "SPARK_PDEATHSIG_PYTHON"


def set_parent_death_signal(sig: int = signal.SIGKILL) -> None:
    """Have the kernel send ``sig`` to this process when its parent thread exits (Linux only)."""
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0) != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"prctl(PR_SET_PDEATHSIG) failed: {os.strerror(errno)}")


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    parent = os.getppid()
    if sys.platform.startswith("linux"):
        set_parent_death_signal()
        # The parent may have died between fork and prctl: then no signal will ever come.
        if os.getppid() != parent:
            os._exit(1)
    python = os.environ.get(REAL_PYTHON_ENV) or sys.executable
    os.execv(python, [python, *args])


if __name__ == "__main__":
    main()
