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
sys.path.insert(0, str(Path(__file__).resolve().parent / "_ext"))

from airflow_shared_stream import __version__  # noqa: E402

project = "airflow-shared-stream"
author = "airflow-shared-stream developers"
copyright = "2026, the airflow-shared-stream developers"
release = __version__
version = __version__

# provider_config: the configuration reference generated from provider.yaml (docs/_ext/).
extensions = ["myst_parser", "sphinx.ext.autodoc", "provider_config"]
myst_enable_extensions = ["colon_fence"]
source_suffix = {".rst": "restructuredtext"}
root_doc = "index"
exclude_patterns = ["_build"]

# The API reference (api.rst): signatures as written, members in source order, and the
# ``:param ...:`` field lists the docstrings use. Type hints go into the description, where a
# long signature does not make the line overflow a phone's width.
autodoc_member_order = "bysource"
autodoc_typehints = "description"
autodoc_class_signature = "separated"
autodoc_default_options = {"members": True, "show-inheritance": True}

# Alabaster, the theme Sphinx ships (the docs group adds no theme package). Its layout is a
# fixed 940 px column; docs/_static/responsive.css lets it use the window's width on a desktop,
# makes wide tables and code blocks scroll inside themselves instead of widening the page, and
# fits images and plots to the column. tests/docs/test_rendering.py checks it in Chromium.
html_theme = "alabaster"
html_title = f"airflow-shared-stream {release}"
html_static_path = ["_static"]
html_css_files = ["responsive.css"]
# page_width is also where alabaster switches to its narrow layout (the sidebar under the page).
html_theme_options = {"page_width": "1100px", "sidebar_width": "240px", "fixed_sidebar": False}
