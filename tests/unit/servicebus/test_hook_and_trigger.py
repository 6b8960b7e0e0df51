"""Pure logic of the Service Bus stream: connection parsing, entity rules, stream identity."""

from __future__ import annotations

import datetime
import json
import uuid
from types import SimpleNamespace

import pytest
from airflow.exceptions import AirflowProviderDeprecationWarning

from airflow_shared_stream.servicebus import (
    ServiceBusConfigurationError,
    ServiceBusSharedStreamHook,
    ServiceBusSharedStreamTrigger,
)
from airflow_shared_stream.servicebus.envelope import jsonable
from airflow_shared_stream.servicebus.hook import Entity

KEY = "c2VjcmV0LWtleS0x"
EMULATOR = (
    f"Endpoint=sb://127.0.0.1:5999;SharedAccessKeyName=k;SharedAccessKey={KEY};UseDevelopmentEmulator=true;"
)


def conn(schema: str | None = None, **extra: str) -> SimpleNamespace:
    return SimpleNamespace(schema=schema, extra_dejson=extra)


def config(connection: SimpleNamespace):
    return ServiceBusSharedStreamHook("sb").config_from(connection)


def test_connection_string_in_schema_resolves_the_namespace():
    cfg = config(
        conn("Endpoint=sb://Orders-NS.servicebus.windows.net/;SharedAccessKeyName=k;SharedAccessKey=v")
    )
    assert cfg.namespace == "orders-ns.servicebus.windows.net"


def test_emulator_connection_string_keeps_the_port_and_hides_the_key():
    cfg = config(conn(EMULATOR))
    assert cfg.namespace == "127.0.0.1:5999"
    assert KEY in cfg.secrets
    assert EMULATOR in cfg.secrets
    assert KEY not in repr(cfg)


def test_bad_connection_string_is_a_configuration_error_without_the_string():
    with pytest.raises(ServiceBusConfigurationError) as caught:
        config(conn(f"nonsense;SharedAccessKey={KEY}"))
    assert KEY not in str(caught.value)


def test_namespace_with_a_credential_or_the_default_chain():
    sas = config(
        conn(fully_qualified_namespace="ns.servicebus.windows.net", credential="SharedAccessSignature x")
    )
    assert (sas.namespace, sas.sas_token) == ("ns.servicebus.windows.net", "SharedAccessSignature x")
    default = config(conn(extra__azure_service_bus__fully_qualified_namespace="ns.servicebus.windows.net"))
    assert default.use_default_credential


@pytest.mark.parametrize(
    "connection",
    [conn(), conn(fully_qualified_namespace="sb://ns.servicebus.windows.net/")],
    ids=["nothing", "url-not-host"],
)
def test_unusable_connections_are_refused(connection):
    with pytest.raises(ServiceBusConfigurationError):
        config(connection)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ((None, None, None), "no entity was given"),
        ((None, "t", None), "subscription_name is missing"),
        (("q", "t", "s"), "not both"),
        (("q/$DeadLetterQueue", None, None), "not a path"),
        (("", None, None), "non-empty"),
    ],
)
def test_exactly_one_queue_or_a_topic_with_a_subscription(args, message):
    with pytest.raises(ServiceBusConfigurationError, match=message):
        ServiceBusSharedStreamTrigger(*args)


def test_subscription_path_and_case_insensitive_identity():
    assert Entity.of(None, "Orders", "Audit").path == "Orders/Subscriptions/Audit"
    a = ServiceBusSharedStreamTrigger("Orders", max_in_flight=10, match="body.a")
    b = ServiceBusSharedStreamTrigger("orders", max_in_flight=20, reject="body.b")
    assert a.shared_stream_key() == b.shared_stream_key()  # tuning never splits a stream
    # Neither connection is defined here, so each keys on its id (test_stream_identity.py: the
    # namespace a defined connection names is the key).
    other = ServiceBusSharedStreamTrigger("orders", azure_service_bus_conn_id="other")
    assert other.shared_stream_key() != a.shared_stream_key()


def test_serialize_round_trips_and_carries_no_connection_details():
    trigger = ServiceBusSharedStreamTrigger(
        topic_name="t", subscription_name="s", session_enabled=True, complete_in_ranges=False
    )
    classpath, kwargs = trigger.serialize()
    assert classpath.endswith("ServiceBusSharedStreamTrigger")
    rebuilt = ServiceBusSharedStreamTrigger(**kwargs)
    assert rebuilt.shared_stream_key() == trigger.shared_stream_key()
    assert rebuilt.producer_kwargs()["complete_in_ranges"] is False  # reaches the producer
    assert set(kwargs) >= {"topic_name", "subscription_name", "azure_service_bus_conn_id", "match", "reject"}


@pytest.mark.parametrize(
    "kwargs",
    [
        {"max_wait_time": 0},
        {"session_enabled": "yes"},
        {"max_concurrent_sessions": 0},
        {"complete_in_ranges": "yes"},
    ],
)
def test_bad_tuning_fails_at_parse(kwargs):
    with pytest.raises(ServiceBusConfigurationError):
        ServiceBusSharedStreamTrigger("q", **kwargs)


def test_lock_duration_seconds_is_deprecated_ignored_and_old_serializations_still_load():
    # A Dag serialized before locks were read from the broker carries the old argument.
    _, kwargs = ServiceBusSharedStreamTrigger("q").serialize()
    old = {**kwargs, "lock_duration_seconds": 60.0}
    with pytest.warns(AirflowProviderDeprecationWarning, match="lock_duration_seconds"):
        rebuilt = ServiceBusSharedStreamTrigger(**old)
    assert "lock_duration_seconds" not in rebuilt.serialize()[1]
    assert "lock_duration_seconds" not in rebuilt.producer_kwargs()
    # Not a shaping argument any more: an old watcher and a new one share the stream.
    assert rebuilt.normalized_shape() == ServiceBusSharedStreamTrigger("q").normalized_shape()
    ServiceBusSharedStreamTrigger.create_shared_stream_producer(old)


def test_sdk_values_become_json():
    when = datetime.datetime(2026, 1, 2, tzinfo=datetime.timezone.utc)
    token = uuid.uuid4()
    value = jsonable({b"k": b"v", "t": when, "u": token, "bin": b"\xff\x00", "n": [1, b"x"]})
    assert value == {"k": "v", "t": when.isoformat(), "u": str(token), "bin": "/wA=", "n": [1, "x"]}
    json.dumps(value)
