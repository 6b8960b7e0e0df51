"""Driver that succeeds at once (no SparkSession: fast) after writing argv[1]."""

from __future__ import annotations

import sys
from pathlib import Path

Path(sys.argv[1]).write_text("hello from the driver\n")
