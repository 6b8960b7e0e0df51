"""
The configuration reference is generated from provider.yaml, and pages link to it.

``docs/_ext/provider_config.py`` renders provider.yaml's ``config:`` section at build time, so
a setting added there is documented without a second copy to keep in step. These tests read
the generator's output and the pages' source; tests/docs/test_rendering.py checks the built HTML.
"""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path
from types import ModuleType

import yaml

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"


def _generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location("provider_config", DOCS / "_ext" / "provider_config.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault(spec.name, module)
    spec.loader.exec_module(module)
    return module


def _config() -> dict:
    return yaml.safe_load((ROOT / "provider.yaml").read_text())["config"]


def test_every_option_of_provider_yaml_is_in_the_reference_with_its_type_default_and_variable() -> None:
    config = _config()
    text = "\n".join(_generator().config_reference_lines(config))

    options = [(section, name, spec) for section, s in config.items() for name, spec in s["options"].items()]
    assert options, "provider.yaml declares no option"
    for section, name, spec in options:
        block = text.split(f".. confval:: [{section}] {name}\n", 1)[1].split(".. confval::", 1)[0]
        assert f":type: {spec['type']}" in block
        default = spec["default"]
        assert (f":default: ``{default}``" if default is not None else ":default: (none)") in block
        assert f"AIRFLOW__{section.upper()}__{name.upper()}" in block
        first_line = str(spec["description"]).strip().splitlines()[0]
        assert first_line in block


def test_an_option_added_to_provider_yaml_appears_without_editing_a_page() -> None:
    config = _config()
    section = next(iter(config))
    config[section]["options"]["brand_new_setting"] = {
        "description": "A setting only this test declares.",
        "type": "integer",
        "default": "7",
        "version_added": "9.9.9",
    }

    text = "\n".join(_generator().config_reference_lines(config))

    assert f".. confval:: [{section}] brand_new_setting" in text
    assert "A setting only this test declares." in text


def test_the_built_configuration_page_uses_the_directive_not_a_copy() -> None:
    page = (DOCS / "configuration.rst").read_text()
    assert ".. provider-config::" in page
    for spec in _config().values():
        for name in spec["options"]:
            assert name not in page, f"{name} is written into configuration.rst by hand"


def test_pages_name_a_setting_through_its_reference_link() -> None:
    """A ``[section] option`` written as a plain literal would not link to the reference."""
    sections = "|".join(re.escape(s) for s in _config())
    unlinked = re.compile(rf"``\[(?:{sections})\]\s+\w+")  # a literal may wrap after its section
    found = [
        f"{page.name}:{page.read_text()[: match.start()].count(chr(10)) + 1}"
        for page in sorted(DOCS.glob("*.rst"))
        for match in unlinked.finditer(page.read_text())
    ]
    assert found == [], "use :confval:`[section] option` in " + ", ".join(found)
