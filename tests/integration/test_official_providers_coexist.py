"""
The official Amazon and Kafka providers, installed beside this one, keep their connection types.

Airflow keeps one hook per connection type, and the UI draws a connection's form from that
hook. A provider that registers ``aws`` or ``kafka`` replaces the official provider's hook and
form for EVERY connection of that type in the deployment. Our triggers read those connections
as the official providers define them and register no such type; this test installs the
official providers next to ours, as a deployment would, and asks Airflow who owns each type.

It builds a throwaway virtualenv with uv (installed in .venv by scripts/bootstrap.sh), pinned
to .venv's own versions, so everything but the two providers comes from uv's cache: about 5 s
to install (the first run on a machine also downloads the two providers) and about 15 s for
two ``airflow providers`` commands.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from tests.support.deployment_venv import deployment_venv, run

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

# connection type -> the distribution that owns it (the brief's list; test_provider_info.py
# checks provider.yaml against all four, this test installs the two this provider reads today).
OFFICIAL_OWNERS = {
    "aws": "apache-airflow-providers-amazon",
    "kafka": "apache-airflow-providers-apache-kafka",
}


@pytest.fixture(scope="module")
def deployment_python(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A virtualenv with this provider and the official Amazon and Kafka providers."""
    return deployment_venv(
        tmp_path_factory.mktemp("official-providers"), "sqs,kafka", list(OFFICIAL_OWNERS.values())
    )


def _airflow_json(python: Path, home: Path, *args: str) -> list[dict[str, Any]]:
    env = {**os.environ, "AIRFLOW_HOME": str(home), "AIRFLOW__CORE__LOAD_EXAMPLES": "False"}
    out = run(str(python), "-m", "airflow", *args, "--output", "json", env=env)
    return json.loads(out)


def test_official_providers_own_their_connection_types(deployment_python: Path, tmp_path: Path) -> None:
    providers = {
        row["package_name"] for row in _airflow_json(deployment_python, tmp_path, "providers", "list")
    }
    # Our provider really is loaded beside them (else the check below would prove nothing).
    assert {"airflow-shared-stream", *OFFICIAL_OWNERS.values()} <= providers

    hooks = {
        row["connection_type"]: row
        for row in _airflow_json(deployment_python, tmp_path, "providers", "hooks")
    }
    for conn_type, owner in OFFICIAL_OWNERS.items():
        assert hooks[conn_type]["package_name"] == owner, (conn_type, hooks[conn_type])
    assert [row for row in hooks.values() if row["package_name"] == "airflow-shared-stream"] == []
