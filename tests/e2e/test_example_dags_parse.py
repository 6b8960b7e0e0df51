"""The example Dags parse in a real dag-processor and register their watchers."""

from __future__ import annotations

import pytest

from tests.e2e.conftest import DAG_IDS, WATCHERS, Stack

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]


def test_example_dags_parse_without_import_errors(stack: Stack) -> None:
    airflow = stack.airflow
    assert airflow.import_errors() == []
    assert airflow.parsed_dag_ids() >= DAG_IDS
    # Both Dags, three watchers each: the serialized triggers reached the metadata DB...
    assert airflow.watcher_trigger_ids().keys() >= WATCHERS
    # ...and the CLI agrees (it reads the same table through Airflow's own code).
    assert "No data found" in airflow.cli("dags", "list-import-errors").stdout


def test_watchers_run_in_the_triggerer(stack: Stack) -> None:
    stack.airflow.wait_for_watchers(WATCHERS, timeout=120)
