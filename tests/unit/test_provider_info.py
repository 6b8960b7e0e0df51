"""The package registers as an Airflow provider, and provider.yaml says what get_provider_info says."""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
from importlib.metadata import entry_points
from pathlib import Path

import yaml

from airflow_shared_stream import __version__
from airflow_shared_stream.get_provider_info import get_provider_info

ROOT = Path(__file__).resolve().parents[2]


def test_get_provider_info_is_generated_from_provider_yaml():
    # The committed file is exactly what the generator writes from provider.yaml (a stale file
    # prints the diff and the command that fixes it).
    result = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "generate_provider_info.py"), "--check"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_provider_yaml_and_get_provider_info_agree():
    from_yaml = yaml.safe_load((ROOT / "provider.yaml").read_text())
    info = get_provider_info()
    assert from_yaml["versions"][0] == __version__, "provider.yaml's newest version is the package's"
    assert {k: v for k, v in from_yaml.items() if k not in ("state", "versions")} == info


# Connection types that official Airflow providers own. Airflow keeps one hook (and one UI
# form) per type, so registering one of these would displace the official provider's hook for
# every connection of that type (tests/integration/test_official_providers_coexist.py shows it
# with the real providers installed).
OFFICIAL_CONNECTION_TYPES = {
    "aws": "apache-airflow-providers-amazon",
    "kafka": "apache-airflow-providers-apache-kafka",
    "google_cloud_platform": "apache-airflow-providers-google",
    "azure_service_bus": "apache-airflow-providers-microsoft-azure",
}


def test_no_connection_type_of_an_official_provider_is_registered():
    registered = {c["connection-type"] for c in get_provider_info().get("connection-types", [])}
    assert registered.isdisjoint(OFFICIAL_CONNECTION_TYPES), {
        t: f"owned by {OFFICIAL_CONNECTION_TYPES[t]}" for t in registered & OFFICIAL_CONNECTION_TYPES.keys()
    }


def test_every_registered_module_and_hook_imports():
    info = get_provider_info()
    for section in ("triggers", "operators", "hooks"):
        for entry in info.get(section, []):
            for module in entry["python-modules"]:
                importlib.import_module(module)
    for connection in info.get("connection-types", []):
        module, _, name = connection["hook-class-name"].rpartition(".")
        hook = getattr(importlib.import_module(module), name)
        assert hook.conn_type == connection["connection-type"]


def test_entry_point_names_the_canonical_distribution():
    provider_entries = entry_points(group="apache_airflow_provider")
    ours = [e for e in provider_entries if e.value.startswith("airflow_shared_stream")]
    [entry] = ours
    assert entry.load()()["package-name"] == entry.dist.metadata["Name"] == "airflow-shared-stream"


def _airflow(*args: str, home: Path) -> str:
    env = {**os.environ, "AIRFLOW_HOME": str(home), "AIRFLOW__CORE__LOAD_EXAMPLES": "False"}
    result = subprocess.run(
        [sys.executable, "-m", "airflow", *args], env=env, capture_output=True, text=True, timeout=180
    )
    assert result.returncode == 0, result.stderr[-2000:]
    return result.stdout


def test_a_real_airflow_lists_the_provider_and_its_triggers(tmp_path):
    providers = _airflow("providers", "list", "--output", "plain", home=tmp_path)
    assert "airflow-shared-stream" in providers
    triggers = _airflow("providers", "triggers", "--output", "plain", home=tmp_path)
    for module in [m for t in get_provider_info()["triggers"] for m in t["python-modules"]]:
        assert module in triggers
    # It registers no hook of its own under any connection type (see OFFICIAL_CONNECTION_TYPES).
    hooks = _airflow("providers", "hooks", "--output", "plain", home=tmp_path)
    assert "airflow-shared-stream" not in hooks
