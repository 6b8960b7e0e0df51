"""
Every repository file the docs and the README name exists.

A page that sends a reader to ``tests/support/x.py`` or ``bench/results/y.md`` must not send
them nowhere; a file that moves takes its mentions along.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TEXTS = [*sorted((ROOT / "docs").glob("*.rst")), ROOT / "README.md", ROOT / "CHANGELOG.rst"]
TOP = ("airflow_shared_stream", "bench", "docs", "example_dags", "scripts", "tests")
NAMED = re.compile(
    r"(?<![\w/.])((?:" + "|".join(TOP) + r")/[\w./-]*\.(?:py|sh|md|rst|txt|toml|yaml|yml|json)"
    r"|\b[A-Z][A-Z_]+\.md\b)"  # and top-level documents: SECURITY.md, never a DESIGN.md we do not ship
)


def named_files() -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for path in TEXTS:
        for name in NAMED.findall(path.read_text()):
            found.setdefault(name, []).append(path.name)
    return found


def test_the_docs_name_files() -> None:
    assert "scripts/demo.sh" in named_files()


def test_every_file_the_docs_name_exists() -> None:
    missing = {
        f"{name} ({', '.join(sorted(set(where)))})"
        for name, where in named_files().items()
        if not (ROOT / name).exists()
    }
    assert not missing, f"named but not in the repository: {sorted(missing)}"
