"""
The configuration reference, generated from provider.yaml's ``config:`` section at build time.

``provider.yaml`` is the one place the provider's settings are declared (Airflow reads them from
it through ``get_provider_info``); writing them out again in a page would let the two drift.
The ``provider-config`` directive renders every section and option as a Sphinx ``confval``, so
other pages link to a setting with ``:confval:`[shared_stream] option```.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from docutils import nodes
from docutils.statemachine import StringList
from sphinx.application import Sphinx
from sphinx.util.docutils import SphinxDirective
from sphinx.util.nodes import nested_parse_with_titles

PROVIDER_YAML = Path(__file__).resolve().parents[2] / "provider.yaml"


def option_name(section: str, option: str) -> str:
    """The name a setting is shown and linked under, as Airflow writes it: ``[section] option``."""
    return f"[{section}] {option}"


def environment_variable(section: str, option: str) -> str:
    return f"AIRFLOW__{section.upper()}__{option.upper()}"


def config_reference_lines(config: dict[str, Any]) -> list[str]:
    """reStructuredText of every section and option of a provider.yaml ``config:`` mapping."""
    lines: list[str] = []
    for section, spec in config.items():
        title = f"``[{section}]``"
        lines += [title, "-" * len(title), ""]
        lines += [*str(spec.get("description", "")).strip().splitlines(), ""]
        for option, details in spec["options"].items():
            lines += [f".. confval:: {option_name(section, option)}"]
            lines += [f"   :type: {details['type']}"]
            default = details.get("default")
            lines += [f"   :default: ``{default}``" if default is not None else "   :default: (none)", ""]
            description = str(details["description"]).strip().splitlines()
            lines += [f"   {line}" if line else "" for line in description]
            lines += [
                "",
                f"   :Environment variable: ``{environment_variable(section, option)}``",
            ]
            if details.get("example") is not None:
                lines += [f"   :Example: ``{details['example']}``"]
            if details.get("version_added"):
                lines += [f"   :Added in: {details['version_added']}"]
            lines += [""]
    return lines


class ProviderConfig(SphinxDirective):
    """``.. provider-config::``: the reference of provider.yaml's ``config:`` section."""

    def run(self) -> list[nodes.Node]:
        self.env.note_dependency(str(PROVIDER_YAML))
        config = yaml.safe_load(PROVIDER_YAML.read_text())["config"]
        node = nodes.Element()
        lines = config_reference_lines(config)
        nested_parse_with_titles(
            self.state, StringList(lines, items=[(str(PROVIDER_YAML), 0)] * len(lines)), node
        )
        return node.children


def setup(app: Sphinx) -> dict[str, Any]:
    app.add_directive("provider-config", ProviderConfig)
    return {"version": "1", "parallel_read_safe": True, "parallel_write_safe": True}
