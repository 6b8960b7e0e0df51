"""
Airflow's ``MessageQueueTrigger(scheme=...)`` resolves our four schemes to our triggers.

These run the real common.messaging provider (the ``common-messaging`` extra) and Airflow's
real ProvidersManager, which discovers the schemes from this checkout's ``queues:``. With the
official providers installed beside ours: tests/integration/test_message_queue_schemes_coexist.py.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
from airflow.providers.common.messaging.triggers.msg_queue import MESSAGE_QUEUE_PROVIDERS, MessageQueueTrigger
from airflow.sdk import DAG, Asset, AssetWatcher
from airflow.serialization.serialized_objects import DagSerialization

from airflow_shared_stream.kafka import KafkaSharedStreamTrigger
from airflow_shared_stream.pubsub import PubSubSharedStreamTrigger
from airflow_shared_stream.queues import SCHEMES, SharedStreamQueueProvider
from airflow_shared_stream.servicebus import ServiceBusSharedStreamTrigger
from airflow_shared_stream.sqs import SqsSharedStreamTrigger

QUEUE_URL = "https://sqs.eu-west-1.amazonaws.com/123456789012/orders"

# scheme -> (our trigger, the arguments a watcher gives it)
WATCHERS: dict[str, tuple[type[Any], dict[str, Any]]] = {
    "shared+kafka": (KafkaSharedStreamTrigger, {"topics": ["orders"], "dead_letter_topic": "orders.dlq"}),
    "shared+sqs": (SqsSharedStreamTrigger, {"queue_url": QUEUE_URL, "reject": "body.order_id == null"}),
    "shared+pubsub": (
        PubSubSharedStreamTrigger,
        {"subscription": "projects/shop-events/subscriptions/orders"},
    ),
    "shared+servicebus": (ServiceBusSharedStreamTrigger, {"queue_name": "orders", "match": "body.big"}),
}


def _ours() -> list[SharedStreamQueueProvider]:
    # The official providers' own queue providers are in the list too when they are installed.
    return [p for p in MESSAGE_QUEUE_PROVIDERS if isinstance(p, SharedStreamQueueProvider)]


def test_every_scheme_is_registered_through_provider_yaml():
    assert sorted(p.scheme for p in _ours()) == sorted(SCHEMES) == sorted(WATCHERS)


@pytest.mark.parametrize("scheme", sorted(WATCHERS))
def test_each_scheme_builds_our_trigger_and_serializes_as_the_direct_form(scheme):
    trigger_class, arguments = WATCHERS[scheme]
    through_common_messaging = MessageQueueTrigger(scheme=scheme, **arguments)
    direct = trigger_class(**arguments)
    assert type(through_common_messaging.trigger) is trigger_class
    # The same classpath and kwargs: the trigger table, the triggerer and the shared-stream key
    # cannot tell the two forms apart, so their watchers share one consumer.
    assert through_common_messaging.serialize() == direct.serialize()
    assert through_common_messaging.trigger.shared_stream_key() == direct.shared_stream_key()


@pytest.mark.parametrize("spelling", ["shared+sqs", "SHARED+SQS", "Shared+Sqs"])
def test_a_scheme_is_case_insensitive(spelling):
    assert MessageQueueTrigger(scheme=spelling, queue_url=QUEUE_URL).serialize()[0] == (
        "airflow_shared_stream.sqs.trigger.SqsSharedStreamTrigger"
    )


@pytest.mark.parametrize(
    "scheme", ["kafka", "sqs", "google+pubsub", "azure+servicebus", "shared", "sqs+shared"]
)
def test_no_scheme_of_the_official_providers_or_a_near_miss_is_ours(scheme):
    assert [p for p in _ours() if p.scheme_matches(scheme)] == []


@pytest.mark.parametrize(
    "uri",
    [
        QUEUE_URL,
        "kafka://127.0.0.1:9092/orders",
        "projects/shop-events/subscriptions/orders",
        "shared+sqs://x",
    ],
)
def test_no_queue_uri_is_ours(uri):
    # The deprecated ``queue=`` form: these URIs name upstreams the official providers match.
    assert [p for p in _ours() if p.queue_matches(uri)] == []


def _dag_with(dag_id: str, trigger: Any) -> DAG:
    orders = Asset(f"s3://lake/{dag_id}", watchers=[AssetWatcher(name=f"{dag_id}_watcher", trigger=trigger)])
    with DAG(dag_id, schedule=[orders]) as dag:
        pass
    return dag


def _serialized_watchers(dag: DAG) -> list[dict[str, Any]]:
    """The watchers' triggers as the dag-processor stores them (the serialized Dag's JSON)."""
    timetable = json.loads(json.dumps(DagSerialization.to_dict(dag)))["dag"]["timetable"]
    return [
        watcher["trigger"]
        for asset in timetable["__var"]["asset_condition"]["objects"]
        for watcher in asset["watchers"]
    ]


@pytest.mark.parametrize("scheme", sorted(WATCHERS))
def test_the_serialized_dag_names_our_trigger_class(scheme):
    trigger_class, arguments = WATCHERS[scheme]
    dag = _dag_with("through_common_messaging", MessageQueueTrigger(scheme=scheme, **arguments))
    [serialized] = _serialized_watchers(dag)
    assert serialized["classpath"] == f"{trigger_class.__module__}.{trigger_class.__qualname__}"
    assert serialized == _serialized_watchers(_dag_with("direct", trigger_class(**arguments)))[0]


@pytest.mark.parametrize("scheme", sorted(WATCHERS))
def test_an_unknown_argument_fails_the_dag_parse_naming_it_and_our_trigger(scheme):
    trigger_class, arguments = WATCHERS[scheme]
    # A typo, and an argument of the official provider's trigger for the same broker.
    for unknown in ("mtach", "apply_function"):
        dag = _dag_with("typo", MessageQueueTrigger(scheme=scheme, **arguments, **{unknown: "x"}))
        with pytest.raises(
            Exception, match=rf"{trigger_class.__name__}.*unexpected keyword argument '{unknown}'"
        ):
            DagSerialization.to_dict(dag)  # what the dag-processor runs: an import error of the file


def test_an_unknown_scheme_names_the_providers_that_exist():
    with pytest.raises(ValueError, match="'shared\\+kinesis' is not recognized"):
        MessageQueueTrigger(scheme="shared+kinesis", stream="orders").serialize()


def test_a_scheme_whose_extra_is_missing_names_the_extra(monkeypatch):
    for name in [
        m
        for m in sys.modules
        if m == "airflow_shared_stream.kafka" or m.startswith("airflow_shared_stream.kafka.")
    ]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "aiokafka", None)  # import aiokafka raises ModuleNotFoundError
    [provider] = [p for p in MESSAGE_QUEUE_PROVIDERS if p.scheme_matches("shared+kafka")]
    with pytest.raises(
        ImportError,
        match=r"install the provider's 'kafka' extra \(pip install 'airflow-shared-stream\[kafka\]'\)",
    ):
        provider.trigger_class()


def test_the_example_dag_declares_one_queue_in_both_forms_and_they_share_one_stream():
    from airflow.dag_processing.dagbag import DagBag
    from airflow.sdk.module_loading import import_string

    example = Path(__file__).resolve().parents[2] / "example_dags" / "message_queue_orders.py"
    bag = DagBag(dag_folder=str(example))
    assert bag.import_errors == {}
    triggers = _serialized_watchers(bag.dags["message_queue_orders"])
    assert len(triggers) == 2
    assert {t["classpath"] for t in triggers} == {"airflow_shared_stream.sqs.trigger.SqsSharedStreamTrigger"}
    rebuilt = [import_string(t["classpath"])(**t["kwargs"]) for t in triggers]
    assert len({trigger.shared_stream_key() for trigger in rebuilt}) == 1
