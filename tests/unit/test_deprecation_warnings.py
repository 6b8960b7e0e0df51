"""
Every deprecation this package raises is Airflow's ``AirflowProviderDeprecationWarning``.

Airflow's providers raise that class so a deployment can filter, or turn into errors, the
deprecations of providers apart from Python's and Airflow core's own. A plain
``DeprecationWarning`` here would slip past such a filter; the check reads the source, so it
also covers deprecated aliases added later.
"""

from __future__ import annotations

import ast
import warnings
from pathlib import Path

import pytest
from airflow.exceptions import AirflowProviderDeprecationWarning

PACKAGE = Path(__file__).resolve().parents[2] / "airflow_shared_stream"
PLAIN = {"DeprecationWarning", "PendingDeprecationWarning", "FutureWarning"}


def _plain_deprecations(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    return [
        f"{path.relative_to(PACKAGE.parent)}:{node.lineno} {node.id}"
        for node in ast.walk(tree)
        if isinstance(node, ast.Name) and node.id in PLAIN
    ]


def test_the_package_names_no_plain_deprecation_warning_class() -> None:
    found = [hit for path in sorted(PACKAGE.rglob("*.py")) for hit in _plain_deprecations(path)]

    assert found == [], "raise AirflowProviderDeprecationWarning instead: " + ", ".join(found)


def test_a_deprecated_module_attribute_warns_with_airflows_provider_class() -> None:
    from airflow_shared_stream.sqs import producer

    with pytest.warns(AirflowProviderDeprecationWarning, match="ack_timeout_seconds is deprecated"):
        producer.ack_timeout_seconds  # noqa: B018 - the attribute access is what warns


def test_airflows_provider_class_is_still_a_deprecation_warning() -> None:
    """Filters written for ``DeprecationWarning`` keep matching what this package raises."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        warnings.warn("x", AirflowProviderDeprecationWarning, stacklevel=1)

    assert issubclass(caught[0].category, DeprecationWarning)
