"""
The example Dags take their settings from the environment, never from ``Variable.get``.

Top-level Dag code runs at every parse; a Variable read there is a metadata-database round
trip per setting per parse, which Airflow's best practices rule out. The Dags are parsed with
Airflow's own DagBag (no database) while ``Variable.get`` raises.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from airflow.dag_processing.dagbag import DagBag
from airflow.sdk import Variable

EXAMPLE_DAGS = Path(__file__).resolve().parents[2] / "example_dags"


@pytest.fixture
def parse_example_dags(monkeypatch: pytest.MonkeyPatch):
    def variable_get(*args: object, **kwargs: object) -> object:
        raise AssertionError(f"Variable.get{args} at parse time")

    monkeypatch.setattr(Variable, "get", variable_get)
    # The dag-processor puts the Dags folder on sys.path, so the Dags import order_pipeline.
    monkeypatch.syspath_prepend(str(EXAMPLE_DAGS))
    monkeypatch.delitem(sys.modules, "order_pipeline", raising=False)

    def parse() -> DagBag:
        bag = DagBag(dag_folder=str(EXAMPLE_DAGS))
        assert bag.import_errors == {}
        return bag

    yield parse
    sys.modules.pop("order_pipeline", None)


def _watchers(bag: DagBag, dag_id: str) -> dict[str, tuple[str, str]]:
    """asset URI -> (trigger class path, serialized trigger kwargs as JSON) for the Dag's assets."""
    return {
        asset.uri: (classpath, json.dumps(kwargs))
        for asset in bag.dags[dag_id].timetable.asset_condition.objects
        for watcher in asset.watchers
        for classpath, kwargs in [watcher.trigger.serialize()]
    }


def test_the_example_dags_read_their_settings_from_the_environment(
    parse_example_dags, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    settings = {
        "SHARED_STREAM_DATA_DIR": str(tmp_path / "data"),
        "ORDERS_KAFKA_TOPIC": "orders-from-env",
        "ORDERS_KAFKA_DEAD_LETTER_TOPIC": "orders-from-env.dlq",
        "ORDERS_KAFKA_GROUP_ID": "group-from-env",
        "ORDERS_SQS_QUEUE_URL": "http://127.0.0.1:9/000000000000/orders-from-env",
        "ORDERS_SQS_DEAD_LETTER_QUEUE_URL": "http://127.0.0.1:9/000000000000/orders-from-env-dlq",
        "SHARED_STREAM_SPARK_CONN_ID": "spark_from_env",
        "SHARED_STREAM_SPARK_DEFERRABLE_CONN_ID": "spark_cluster_from_env",
        "ORDERS_SERVICEBUS_QUEUE": "orders-from-env",
        "ORDERS_SERVICEBUS_CONN_ID": "servicebus_from_env",
    }
    for name, value in settings.items():
        monkeypatch.setenv(name, value)

    bag = parse_example_dags()

    kafka = _watchers(bag, "kafka_orders_pipeline")
    sqs = _watchers(bag, "sqs_orders_pipeline")
    assert len(kafka) == len(sqs) == 3
    for uri in [*kafka, *sqs]:
        assert uri.startswith(f"file://{tmp_path / 'data'}/")
    for _, kwargs in kafka.values():
        for name in ("ORDERS_KAFKA_TOPIC", "ORDERS_KAFKA_DEAD_LETTER_TOPIC", "ORDERS_KAFKA_GROUP_ID"):
            assert json.dumps(settings[name]) in kwargs, name
    for _, kwargs in sqs.values():
        for name in ("ORDERS_SQS_QUEUE_URL", "ORDERS_SQS_DEAD_LETTER_QUEUE_URL"):
            assert json.dumps(settings[name]) in kwargs, name
    servicebus = _watchers(bag, "servicebus_orders_pipeline")
    assert len(servicebus) == 3
    for _, kwargs in servicebus.values():
        for name in ("ORDERS_SERVICEBUS_QUEUE", "ORDERS_SERVICEBUS_CONN_ID"):
            assert json.dumps(settings[name]) in kwargs, name
    for dag_id in ("kafka_orders_pipeline", "sqs_orders_pipeline", "servicebus_orders_pipeline"):
        tasks = bag.dags[dag_id].task_dict
        assert tasks["spark_submit"]._conn_id == "spark_from_env"
        assert tasks["spark_submit_deferrable"]._conn_id == "spark_cluster_from_env"


def test_the_example_dags_parse_with_their_defaults(
    parse_example_dags, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("ORDERS_KAFKA_TOPIC", "ORDERS_SQS_QUEUE_URL", "SHARED_STREAM_DATA_DIR"):
        monkeypatch.delenv(name, raising=False)
    bag = parse_example_dags()
    assert {"kafka_orders_pipeline", "sqs_orders_pipeline", "servicebus_orders_pipeline"} <= bag.dags.keys()
    for _, kwargs in _watchers(bag, "kafka_orders_pipeline").values():
        assert '"orders"' in kwargs


def test_every_task_of_the_order_pipelines_retries(parse_example_dags) -> None:
    """
    Issue 50: on a loaded machine a task failed before it started (an Execution API read
    timeout) and, with no retries, failed its run. The example Dags retry as a production Dag would.
    """
    bag = parse_example_dags()
    pipelines = [dag for dag_id, dag in bag.dags.items() if dag_id.endswith("_pipeline")]
    assert pipelines
    for dag in pipelines:
        for task in dag.tasks:
            assert task.retries >= 1, f"{dag.dag_id}.{task.task_id} does not retry"
