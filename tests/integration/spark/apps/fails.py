"""Driver that fails at once with a recognisable error (no SparkSession: fast)."""

from __future__ import annotations

import sys

raise RuntimeError(f"input batch {sys.argv[1] if len(sys.argv) > 1 else '?'} is corrupt")
