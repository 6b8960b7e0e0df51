"""Run one probe trigger in a real ``airflow triggerer`` and read what it reported from the runner."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.support.airflow import AirflowDeployment
from tests.support.processes import wait_until


def probe_report(tmp_path: Path, dag: str, asset: str) -> dict[str, Any]:
    """
    The payload of the first asset event of ``asset``: a Dag file (``dag``) whose asset is watched
    by a probe trigger, served by a fresh deployment's dag-processor and triggerer (no scheduler:
    the event itself is the report).
    """
    dags = tmp_path / "dags"
    dags.mkdir()
    (dags / f"{asset}.py").write_text(dag)
    deployment = AirflowDeployment(home=tmp_path / "home", dags_folder=dags)
    deployment.migrate()
    try:
        deployment.start_component("dag-processor")
        deployment.start_component("triggerer")

        def reported() -> bool:
            deployment.check_alive()
            return bool(deployment.asset_events(asset))

        wait_until(reported, 300, f"the {asset} event from the trigger runner", interval=0.5)
        return dict(deployment.asset_events(asset)[0].payload)
    finally:
        deployment.stop()
