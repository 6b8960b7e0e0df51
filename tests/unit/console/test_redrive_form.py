"""
The page starts runs of the real redrive example Dag: what it sends must be exactly the Dag's
params, valid for them, for every broker the page can redrive (so the two cannot drift).
"""

from __future__ import annotations

import copy
import re
from importlib import resources
from pathlib import Path
from typing import Any

import pytest

from airflow_shared_stream.console.api import RedriveRequest
from airflow_shared_stream.console.streams import STREAM_REDRIVE_PARAMS, group_streams
from airflow_shared_stream.redrive_dag import REDRIVE_DAG_ID
from airflow_shared_stream.redrive_grant import GRANT_PARAM

DAG_FILE = Path(__file__).parents[3] / "example_dags" / "shared_stream_redrive_dead_letters.py"

ROWS: dict[str, tuple[str, dict[str, Any]]] = {
    "sqs": (
        "airflow_shared_stream.sqs.trigger.SqsSharedStreamTrigger",
        {
            "queue_url": "https://sqs.us-east-1.amazonaws.com/000000000000/orders",
            "dead_letter_queue_url": "https://sqs.us-east-1.amazonaws.com/000000000000/orders-dlq",
        },
    ),
    "kafka": (
        "airflow_shared_stream.kafka.trigger.KafkaSharedStreamTrigger",
        {"topics": ["orders"], "dead_letter_topic": "orders-dlq"},
    ),
    "servicebus": (
        "airflow_shared_stream.servicebus.trigger.ServiceBusSharedStreamTrigger",
        {"topic_name": "orders", "subscription_name": "billing"},
    ),
}


@pytest.fixture(scope="module")
def dag() -> Any:
    from airflow.dag_processing.dagbag import DagBag

    bag = DagBag(dag_folder=str(DAG_FILE))
    assert not bag.import_errors
    return bag.dags[REDRIVE_DAG_ID]


def test_what_the_page_sends_is_exactly_the_dags_params(dag: Any) -> None:
    assert set(STREAM_REDRIVE_PARAMS) | set(RedriveRequest.model_fields) | {GRANT_PARAM} == set(dag.params)
    assert not set(STREAM_REDRIVE_PARAMS) & set(RedriveRequest.model_fields)
    assert GRANT_PARAM not in set(STREAM_REDRIVE_PARAMS) | set(RedriveRequest.model_fields)


def test_the_pages_form_has_a_field_for_each_choice_the_person_makes() -> None:
    html = resources.files("airflow_shared_stream.console").joinpath("static/streams.html").read_text()
    form = html[html.index('el("form"') : html.index("form.addEventListener")]
    assert set(re.findall(r'name: "(\w+)"', form)) == set(RedriveRequest.model_fields)


@pytest.mark.parametrize("broker", sorted(ROWS))
def test_each_brokers_run_conf_is_valid_for_the_dag(dag: Any, broker: str) -> None:
    classpath, kwargs = ROWS[broker]
    (stream,) = group_streams([(1, classpath, kwargs, 1)])
    assert set(stream.redrive_params) == set(STREAM_REDRIVE_PARAMS)
    conf = {
        **stream.redrive_params,
        **RedriveRequest(filter="body.n", max_messages=5).model_dump(),
        GRANT_PARAM: "signed-by-the-page",
    }
    params = copy.deepcopy(dag.params)
    params.update(conf)  # as a run's conf lands on the Dag's params
    assert params.validate() == conf


def test_a_blank_max_messages_leaves_the_dags_default(dag: Any) -> None:
    """The page sends a blank field as ``null``: it must not override the default with "unbounded"."""
    classpath, kwargs = ROWS["sqs"]
    (stream,) = group_streams([(1, classpath, kwargs, 1)])
    request = RedriveRequest.model_validate({"filter": None, "max_messages": None, "dry_run": False})
    params = copy.deepcopy(dag.params)
    params.update({**stream.redrive_params, **request.params()})
    assert params.validate()["max_messages"] == 100


def test_a_filter_that_does_not_compile_is_refused_where_the_redrive_is_asked_for() -> None:
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="filter is not a valid"):
        RedriveRequest.model_validate({"filter": "body.[", "max_messages": 5})
