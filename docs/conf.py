"""
Sphinx configuration of the airflow-shared-stream docs.

The test command builds these pages with warnings as errors (``scripts/test.sh``), so a page
with a broken reference, a missing include or a malformed table does not land. Benchmark and
reliability tables are Markdown files the scripts under ``bench/`` and ``scripts/`` write; the
pages include them through MyST (``:parser: myst_parser.sphinx_``) instead of copying numbers.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from airflow_shared_stream import __version__  # noqa: E402

project = "airflow-shared-stream"
author = "airflow-shared-stream developers"
copyright = "2026, the airflow-shared-stream developers"
release = __version__
version = __version__

extensions = ["myst_parser"]
myst_enable_extensions = ["colon_fence"]
source_suffix = {".rst": "restructuredtext"}
root_doc = "index"
exclude_patterns = ["_build"]

html_theme = "alabaster"
html_title = f"airflow-shared-stream {release}"
