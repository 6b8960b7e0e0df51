"""
Every ``[section] option`` the docs, the README and the changelog name is a setting that exists.

A user copies these names into ``airflow.cfg`` or ``AIRFLOW__SECTION__OPTION``; Airflow ignores a
setting it does not know, so a misspelt or invented name in the docs is silently a default. An
option exists when this provider declares it (provider.yaml's ``config:``) or Airflow's own
configuration has it.
"""

from __future__ import annotations

import re
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
SETTING = re.compile(r"\[([a-z_]+)\]\s+([a-z][a-z0-9_]*)")
TEXTS = [*sorted((ROOT / "docs").glob("*.rst")), ROOT / "README.md", ROOT / "CHANGELOG.rst"]


def named_settings() -> dict[tuple[str, str], list[str]]:
    found: dict[tuple[str, str], list[str]] = {}
    for path in TEXTS:
        # A name can wrap onto the next line in a paragraph.
        for section, option in SETTING.findall(path.read_text()):
            found.setdefault((section, option), []).append(path.name)
    return found


def provider_settings() -> set[tuple[str, str]]:
    config = yaml.safe_load((ROOT / "provider.yaml").read_text())["config"]
    return {(section, option) for section, spec in config.items() for option in spec["options"]}


def test_the_docs_name_settings_at_all() -> None:
    assert ("triggerer", "shared_stream_ack_timeout") in named_settings()


def test_every_setting_the_docs_name_exists() -> None:
    from airflow.configuration import conf

    # Airflow's declared options (config.yml), those without a default included.
    airflows = {
        (section, option)
        for section, spec in conf.configuration_description.items()
        for option in (spec.get("options") or {})
    }
    known = airflows | provider_settings()
    unknown = {
        f"[{section}] {option} ({', '.join(sorted(set(where)))})"
        for (section, option), where in named_settings().items()
        if (section, option) not in known
    }
    assert not unknown, f"settings that neither Airflow nor provider.yaml has: {sorted(unknown)}"
