#!/usr/bin/env python3
"""
Write ``airflow_shared_stream/get_provider_info.py`` from ``provider.yaml``.

``provider.yaml`` is the one place the provider's metadata is edited (integrations, triggers,
operators, hooks, connection types), as in Airflow's own providers. Airflow does not read that
file at run time: its ProvidersManager calls the ``apache_airflow_provider`` entry point,
``get_provider_info()``, so the same content must also exist as Python. Writing it by hand
let the two drift; this script is the only writer of the Python file.

Workflow: edit ``provider.yaml``, then run ``.venv/bin/python scripts/generate_provider_info.py``
and commit both files. ``--check`` exits 1 with a diff when the committed file is stale
(tests/unit/test_provider_info.py runs it).

Release bookkeeping (``state``, ``versions``) stays in ``provider.yaml`` only, as Airflow's
generator does: the version Airflow reports comes from the installed distribution.
"""

from __future__ import annotations

import argparse
import difflib
import json
import sys
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
PROVIDER_YAML = ROOT / "provider.yaml"
TARGET = ROOT / "airflow_shared_stream" / "get_provider_info.py"

# Keys of provider.yaml that describe a release, not what the provider registers.
RELEASE_ONLY_KEYS = ("state", "versions")

HEADER = '''\
# NOTE: GENERATED FILE, DO NOT EDIT. Edit provider.yaml, then run
#   .venv/bin/python scripts/generate_provider_info.py
# (tests/unit/test_provider_info.py fails while this file and provider.yaml differ).
"""Provider metadata for Airflow's ProvidersManager (entry point ``apache_airflow_provider``)."""

from __future__ import annotations

from typing import Any


def get_provider_info() -> dict[str, Any]:
    return '''


def _literal(value: Any, indent: int) -> str:
    """
    ``value`` as a Python literal in the layout ``ruff format`` keeps.

    Every non-empty dict and list is exploded one item per line with a trailing comma, which
    ruff leaves as it is (magic trailing comma), so the output needs no formatter to be stable.
    """
    pad = " " * (indent + 4)
    if isinstance(value, dict):
        if not value:
            return "{}"
        items = "".join(f"{pad}{_literal(k, 0)}: {_literal(v, indent + 4)},\n" for k, v in value.items())
        return "{\n" + items + " " * indent + "}"
    if isinstance(value, list):
        if not value:
            return "[]"
        items = "".join(f"{pad}{_literal(v, indent + 4)},\n" for v in value)
        return "[\n" + items + " " * indent + "]"
    if isinstance(value, str):
        # JSON's escapes are all valid Python escapes; ensure_ascii=False keeps text readable.
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, bool) or value is None or isinstance(value, (int, float)):
        return repr(value)
    raise TypeError(f"provider.yaml holds a {type(value).__name__}, which this generator cannot write")


def provider_info_from_yaml(path: Path = PROVIDER_YAML) -> dict[str, Any]:
    data = yaml.safe_load(path.read_text())
    return {key: value for key, value in data.items() if key not in RELEASE_ONLY_KEYS}


def render(info: dict[str, Any]) -> str:
    return HEADER + _literal(info, indent=4) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    parser.add_argument(
        "--check", action="store_true", help="exit 1 (with a diff) if the file is not what provider.yaml says"
    )
    args = parser.parse_args(argv)
    expected = render(provider_info_from_yaml())
    current = TARGET.read_text() if TARGET.exists() else ""
    if args.check:
        if current == expected:
            return 0
        diff = difflib.unified_diff(
            current.splitlines(keepends=True),
            expected.splitlines(keepends=True),
            fromfile=f"{TARGET.relative_to(ROOT)} (committed)",
            tofile=f"{TARGET.relative_to(ROOT)} (from provider.yaml)",
        )
        sys.stdout.writelines(diff)
        print(
            f"\n{TARGET.relative_to(ROOT)} is stale: run "
            ".venv/bin/python scripts/generate_provider_info.py and commit the result."
        )
        return 1
    if current != expected:
        TARGET.write_text(expected)
        print(f"wrote {TARGET.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
