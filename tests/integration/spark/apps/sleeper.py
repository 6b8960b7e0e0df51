"""Driver that records its PID (argv[1]) and sleeps: the target of deadline and kill tests."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

pid_file = Path(sys.argv[1])
tmp = pid_file.with_suffix(".tmp")
tmp.write_text(f"{os.getpid()}\n{os.getppid()}\n")
tmp.rename(pid_file)
time.sleep(float(sys.argv[2]) if len(sys.argv) > 2 else 600)
