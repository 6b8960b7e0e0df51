"""Pure logic of the Pub/Sub shared stream: names, connection reading, the stream key, errors."""

from __future__ import annotations

import importlib
import json

import pytest
from airflow.exceptions import AirflowProviderDeprecationWarning

from airflow_shared_stream.pubsub.client import PubSubClient
from airflow_shared_stream.pubsub.errors import (
    PubSubAccessError,
    PubSubConfigurationError,
    PubSubEndpointError,
    PubSubNotFoundError,
)
from airflow_shared_stream.pubsub.hook import (
    PubSubClientConfig,
    PubSubSharedStreamHook,
    ResourceName,
    config_from_extra,
)
from airflow_shared_stream.pubsub.trigger import PubSubSharedStreamTrigger

PROJECT = "shop-prod-1"


@pytest.fixture(scope="module")
def service_account_key() -> dict[str, str]:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa

    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    ).decode()
    return {
        "type": "service_account",
        "project_id": "key-project-9",
        "private_key_id": "0123456789abcdef0123456789abcdef01234567",
        "private_key": pem,
        "client_email": "reader@key-project-9.iam.gserviceaccount.com",
        "client_id": "1234567890",
        "token_uri": "https://oauth2.googleapis.com/token",
    }


@pytest.fixture
def no_emulator(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    """No emulator and no application default credentials anywhere (no metadata server check)."""
    monkeypatch.delenv("PUBSUB_EMULATOR_HOST", raising=False)
    monkeypatch.delenv("GOOGLE_APPLICATION_CREDENTIALS", raising=False)
    monkeypatch.setenv("CLOUDSDK_CONFIG", str(tmp_path / "gcloud"))
    monkeypatch.setenv("NO_GCE_CHECK", "True")


# -- names -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "project", "expected"),
    [
        ("orders-sub", PROJECT, f"projects/{PROJECT}/subscriptions/orders-sub"),
        (
            f"projects/{PROJECT}/subscriptions/orders-sub",
            None,
            f"projects/{PROJECT}/subscriptions/orders-sub",
        ),
        (
            f"projects/{PROJECT}/subscriptions/orders-sub",
            PROJECT,
            f"projects/{PROJECT}/subscriptions/orders-sub",
        ),
        ("example.com:shop-prod/x", None, None),
    ],
)
def test_subscription_names_normalise_to_the_full_path(value, project, expected):
    if expected is None:
        with pytest.raises(PubSubConfigurationError, match="not a Pub/Sub subscription name"):
            ResourceName.parse(value, "subscriptions", "subscription")
        return
    assert ResourceName.parse(value, "subscriptions", "subscription").resolve(project) == expected


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("", "non-empty string"),
        ("ab", "not a Pub/Sub subscription name"),
        ("goog-orders", "not a Pub/Sub subscription name"),
        ("1orders", "not a Pub/Sub subscription name"),
        (f"projects/{PROJECT}/topics/orders", "names a topic, not a subscription"),
        ("projects/Bad_Project/subscriptions/orders", "not a Pub/Sub subscription name"),
    ],
)
def test_bad_subscription_names_fail_at_parse_time(value, message):
    with pytest.raises(PubSubConfigurationError, match=message):
        PubSubSharedStreamTrigger(value)


def test_a_project_id_that_disagrees_with_the_full_path_is_refused():
    with pytest.raises(PubSubConfigurationError, match="disagrees"):
        PubSubSharedStreamTrigger(f"projects/{PROJECT}/subscriptions/orders", project_id="other-project")


def test_a_short_name_without_any_project_says_what_to_set():
    with pytest.raises(PubSubConfigurationError, match="pass project_id, use the full path"):
        ResourceName.parse("orders", "subscriptions", "subscription").resolve(None)


# -- the trigger's stream identity -----------------------------------------------------------


def test_short_name_project_id_and_full_path_are_one_stream(monkeypatch):
    monkeypatch.setenv(
        "AIRFLOW_CONN_GOOGLE_CLOUD_DEFAULT",
        json.dumps({"conn_type": "google_cloud_platform", "extra": {"project": PROJECT}}),
    )
    keys = {
        PubSubSharedStreamTrigger("orders").shared_stream_key(),
        PubSubSharedStreamTrigger("orders", project_id=PROJECT, max_in_flight=10).shared_stream_key(),
        PubSubSharedStreamTrigger(
            f"projects/{PROJECT}/subscriptions/orders", match="body.a"
        ).shared_stream_key(),
    }
    assert keys == {("airflow_shared_stream.pubsub", f"projects/{PROJECT}/subscriptions/orders")}


def test_the_connections_legacy_prefixed_project_and_the_keys_project_count(monkeypatch, service_account_key):
    monkeypatch.setenv(
        "AIRFLOW_CONN_LEGACY",
        json.dumps(
            {
                "conn_type": "google_cloud_platform",
                "extra": {"extra__google_cloud_platform__project": PROJECT},
            }
        ),
    )
    monkeypatch.setenv(
        "AIRFLOW_CONN_KEYED",
        json.dumps(
            {"conn_type": "google_cloud_platform", "extra": {"keyfile_dict": json.dumps(service_account_key)}}
        ),
    )
    legacy = PubSubSharedStreamTrigger("orders", gcp_conn_id="legacy").shared_stream_key()
    keyed = PubSubSharedStreamTrigger("orders", gcp_conn_id="keyed").shared_stream_key()
    assert legacy[1] == f"projects/{PROJECT}/subscriptions/orders"
    assert keyed[1] == "projects/key-project-9/subscriptions/orders"


def test_an_unresolvable_project_gets_a_key_of_its_own_and_never_reads_at_parse_time(monkeypatch):
    monkeypatch.delenv("AIRFLOW_CONN_GOOGLE_CLOUD_DEFAULT", raising=False)
    trigger = PubSubSharedStreamTrigger("orders")  # constructing reads no connection
    assert trigger.shared_stream_key() == (
        "airflow_shared_stream.pubsub",
        "unresolved",
        "google_cloud_default",
        "orders",
    )


def test_serialize_round_trips_and_carries_no_credentials(monkeypatch, service_account_key):
    trigger = PubSubSharedStreamTrigger(
        "orders", project_id=PROJECT, dead_letter_topic="orders-dlq", match="body.kind == 'order'"
    )
    classpath, kwargs = trigger.serialize()
    assert classpath == "airflow_shared_stream.pubsub.trigger.PubSubSharedStreamTrigger"
    assert kwargs == {
        "subscription": "orders",
        "project_id": PROJECT,
        "gcp_conn_id": "google_cloud_default",
        "dead_letter_topic": "orders-dlq",
        "max_in_flight": 500,
        "max_payload_bytes": 65536,
        "match": "body.kind == 'order'",
        "reject": None,
    }
    assert PubSubSharedStreamTrigger(**kwargs).serialize() == (classpath, kwargs)


def test_a_short_and_a_full_dead_letter_topic_agree(monkeypatch):
    short = PubSubSharedStreamTrigger("orders", project_id=PROJECT, dead_letter_topic="dlq")
    full = PubSubSharedStreamTrigger(
        "orders", project_id=PROJECT, dead_letter_topic=f"projects/{PROJECT}/topics/dlq"
    )
    PubSubSharedStreamTrigger.check_shape_agrees(short.normalized_shape(), full.normalized_shape())
    assert short.normalized_shape()["dead_letter_topic"] == f"projects/{PROJECT}/topics/dlq"


# -- the connection --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("module", "old", "new"),
    [
        ("airflow_shared_stream.pubsub", "PubSubHook", PubSubSharedStreamHook),
        ("airflow_shared_stream.pubsub", "PubSubClientSettings", PubSubClientConfig),
        ("airflow_shared_stream.pubsub.hook", "PubSubHook", PubSubSharedStreamHook),
        ("airflow_shared_stream.pubsub.hook", "PubSubClientSettings", PubSubClientConfig),
        ("airflow_shared_stream.pubsub.hook", "settings_from_extra", config_from_extra),
    ],
)
def test_the_old_names_still_import_and_say_they_are_deprecated(module, old, new):
    with pytest.warns(
        AirflowProviderDeprecationWarning, match=f"{module}.{old} is deprecated; use {new.__name__}"
    ):
        assert getattr(importlib.import_module(module), old) is new


async def test_aget_client_settings_still_answers_and_says_it_is_deprecated(monkeypatch):
    monkeypatch.setenv("PUBSUB_EMULATOR_HOST", "127.0.0.1:1")
    monkeypatch.setenv(
        "AIRFLOW_CONN_GOOGLE_CLOUD_DEFAULT",
        json.dumps({"conn_type": "google_cloud_platform", "extra": {"project": PROJECT}}),
    )
    with pytest.warns(AirflowProviderDeprecationWarning, match="use aget_client_config"):
        config = await PubSubSharedStreamHook().aget_client_settings()
    assert config == await PubSubSharedStreamHook().aget_client_config()


def test_emulator_needs_no_credentials(monkeypatch):
    monkeypatch.setenv("PUBSUB_EMULATOR_HOST", "127.0.0.1:1")
    config = config_from_extra({"project": PROJECT}, "gcp")
    assert (config.project, config.emulator_host, config.credentials) == (PROJECT, "127.0.0.1:1", None)


def test_keyfile_dict_loads_and_stays_out_of_repr_and_errors(no_emulator, service_account_key):
    raw = json.dumps(service_account_key)
    config = config_from_extra(
        {"keyfile_dict": raw, "scope": "https://www.googleapis.com/auth/pubsub"}, "gcp"
    )
    assert config.project == "key-project-9"
    assert config.credentials_source == "extra.keyfile_dict"
    assert config.credentials.service_account_email == service_account_key["client_email"]
    assert "PRIVATE KEY" not in repr(config)
    assert service_account_key["private_key"] in config.secrets


def test_key_path_loads(no_emulator, service_account_key, tmp_path):
    path = tmp_path / "key.json"
    path.write_text(json.dumps(service_account_key))
    config = config_from_extra(
        {"extra__google_cloud_platform__key_path": str(path), "project": PROJECT}, "gcp"
    )
    assert config.project == PROJECT  # the connection's project wins over the key's
    assert config.credentials_source == "extra.key_path"


def test_a_broken_key_is_named_without_its_content(no_emulator, service_account_key):
    broken = dict(
        service_account_key,
        private_key="-----BEGIN PRIVATE KEY-----\nnot-a-key-s3cr3t\n-----END PRIVATE KEY-----\n",
    )
    with pytest.raises(PubSubConfigurationError) as exc_info:
        config_from_extra({"keyfile_dict": json.dumps(broken)}, "gcp")
    assert "extra.keyfile_dict of connection 'gcp'" in str(exc_info.value)
    assert "s3cr3t" not in str(exc_info.value)
    with pytest.raises(PubSubConfigurationError, match="not a JSON object") as exc_info:
        config_from_extra({"keyfile_dict": "{s3cr3t"}, "gcp")
    assert "s3cr3t" not in str(exc_info.value)


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"key_path": "/nowhere/key.json"}, "not a readable file"),
        ({"key_path": "/nowhere/key.p12"}, "P12"),
        ({"key_path": "/k.json", "keyfile_dict": "{}"}, "set only one way"),
        ({"key_secret_name": "pubsub-key"}, "does not support"),
        ({"impersonation_chain": "sa@p.iam.gserviceaccount.com"}, "does not support"),
        ({}, "no Google credentials"),
    ],
)
def test_connection_problems_are_named(no_emulator, extra, message):
    with pytest.raises(PubSubConfigurationError, match=message):
        config_from_extra(extra, "gcp")


def test_anonymous_credentials(no_emulator):
    config = config_from_extra({"is_anonymous": "true", "project": PROJECT}, "gcp")
    assert config.credentials_source == "anonymous"


# -- errors ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("error", "kind", "text"),
    [
        ("NotFound", PubSubNotFoundError, "does not exist"),
        ("PermissionDenied", PubSubAccessError, "refused the connection's credentials"),
        ("Unauthenticated", PubSubAccessError, "refused the connection's credentials"),
        ("ServiceUnavailable", PubSubEndpointError, "did not answer"),
        ("DeadlineExceeded", PubSubEndpointError, "did not answer"),
        ("InvalidArgument", PubSubConfigurationError, "was refused"),
    ],
)
def test_google_errors_become_ours_without_secrets(error, kind, text):
    from google.api_core import exceptions

    secret = "-----BEGIN PRIVATE KEY-----s3cr3t"
    config = PubSubClientConfig(
        project=PROJECT, emulator_host=None, credentials_source="x", secrets=(secret,)
    )
    client = PubSubClient(config, gcp_conn_id="gcp")
    exc = getattr(exceptions, error)(f"server said: {secret}")
    ours = client.explain(exc, "Pull", f"projects/{PROJECT}/subscriptions/orders")
    assert isinstance(ours, kind)
    assert text in str(ours)
    assert f"projects/{PROJECT}/subscriptions/orders" in str(ours)
    assert "s3cr3t" not in str(ours)
