"""At-least-once shared-stream triggers and a deferrable Spark operator for Apache Airflow."""

from __future__ import annotations

import sys

__version__ = "0.1.0"

MIN_AIRFLOW_VERSION = "3.3.2"
"""The lower bound of ``apache-airflow`` in pyproject.toml: the first release whose shared-stream
ack channel has lanes and rejects, which every trigger here settles through."""


def _airflow_version() -> str | None:
    """
    The running Airflow's version; ``None`` where Airflow is not installed.

    Airflow's own ``__version__`` once Airflow is imported (every Airflow component, and a Dag
    file, imports it first); otherwise the installed distribution's, read without importing
    Airflow, whose import initializes its settings: the Spark driver launcher
    (``airflow_shared_stream.spark.driver_python``) runs on Spark nodes and must not do that.
    """
    airflow = sys.modules.get("airflow")
    version = getattr(airflow, "__version__", None)
    if isinstance(version, str):
        return version
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as distribution_version

    try:
        return distribution_version("apache-airflow")
    except PackageNotFoundError:
        return None


def require_airflow(version: str | None) -> None:
    """Refuse to load on an Airflow older than :data:`MIN_AIRFLOW_VERSION`, as Airflow's providers do."""
    if version is None:
        return
    from packaging.version import Version

    if Version(Version(version).base_version) < Version(MIN_AIRFLOW_VERSION):
        raise RuntimeError(
            f"The package `airflow-shared-stream:{__version__}` needs Apache Airflow "
            f"{MIN_AIRFLOW_VERSION}+ (its shared-stream ack channel); this is Airflow {version}. "
            f"Upgrade Airflow, or uninstall airflow-shared-stream."
        )


require_airflow(_airflow_version())
