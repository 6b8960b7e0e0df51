"""Without Airflow's Spark provider (the ``spark`` extra), the operator says what to install."""

from __future__ import annotations

import importlib
import sys

import airflow.sdk  # noqa: F401 - loaded first, as in every process that parses Dags
import pytest


def test_the_operator_without_the_spark_provider_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    # None in sys.modules makes the import fail as if the provider were not installed;
    # monkeypatch puts both entries back afterwards.
    monkeypatch.setitem(sys.modules, "airflow.providers.apache.spark", None)
    monkeypatch.delitem(sys.modules, "airflow_shared_stream.spark.operators", raising=False)
    with pytest.raises(ImportError, match=r"pip install 'airflow-shared-stream\[spark\]'"):
        importlib.import_module("airflow_shared_stream.spark.operators")


def test_the_trigger_and_hook_need_no_spark_provider(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "airflow.providers.apache.spark", None)
    for module in ("airflow_shared_stream.spark.triggers", "airflow_shared_stream.spark.hook"):
        monkeypatch.delitem(sys.modules, module, raising=False)
        importlib.import_module(module)
