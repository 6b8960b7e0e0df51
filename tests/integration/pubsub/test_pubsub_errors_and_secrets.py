"""Bad input against the real emulator: every failure names the problem and carries no secret."""

from __future__ import annotations

import json
import logging
import re
import socket

import pytest

from airflow_shared_stream.pubsub.errors import (
    PubSubConfigurationError,
    PubSubEndpointError,
    PubSubNotFoundError,
)
from airflow_shared_stream.pubsub.producer import PubSubSharedStreamProducer
from airflow_shared_stream.pubsub.trigger import PubSubSharedStreamTrigger

pytestmark = pytest.mark.integration

SECRET = "pr1vate-key-material-never-logged"


async def test_missing_dead_letter_topic(pubsub, harness):
    _, subscription = pubsub.topic_with_subscription()
    watcher = harness.add(PubSubSharedStreamTrigger(subscription, dead_letter_topic="no-such-topic"))
    error = await watcher.wait_for_error()
    assert isinstance(error, PubSubNotFoundError)
    assert f"projects/{pubsub.project}/topics/no-such-topic" in str(error)


async def test_dead_letter_topic_that_is_the_source_topic(pubsub, harness):
    topic, subscription = pubsub.topic_with_subscription()
    watcher = harness.add(PubSubSharedStreamTrigger(subscription, dead_letter_topic=topic))
    error = await watcher.wait_for_error()
    assert isinstance(error, PubSubConfigurationError)
    assert "would come straight back" in str(error)


async def test_missing_project(pubsub, harness, monkeypatch):
    monkeypatch.setenv("AIRFLOW_CONN_NO_PROJECT", json.dumps({"conn_type": "google_cloud_platform"}))
    watcher = harness.add(PubSubSharedStreamTrigger("orders", gcp_conn_id="no_project"))
    error = await watcher.wait_for_error()
    assert isinstance(error, PubSubConfigurationError)
    assert "no project for subscription 'orders'" in str(error)


async def test_missing_connection(pubsub, harness):
    watcher = harness.add(PubSubSharedStreamTrigger("orders", gcp_conn_id="not_defined_anywhere"))
    error = await watcher.wait_for_error()
    assert isinstance(error, PubSubConfigurationError)
    assert "'not_defined_anywhere' is not defined" in str(error)


async def test_no_credentials_outside_the_emulator(pubsub, harness, monkeypatch, tmp_path):
    monkeypatch.delenv("PUBSUB_EMULATOR_HOST")
    monkeypatch.delenv("GOOGLE_APPLICATION_CREDENTIALS", raising=False)
    monkeypatch.setenv("CLOUDSDK_CONFIG", str(tmp_path))
    monkeypatch.setenv("NO_GCE_CHECK", "True")
    watcher = harness.add(PubSubSharedStreamTrigger("orders"))
    error = await watcher.wait_for_error()
    assert isinstance(error, PubSubConfigurationError)
    assert "no Google credentials" in str(error)
    assert "application default credentials were not found" in str(error)


async def test_a_broken_key_fails_without_quoting_it(pubsub, harness, monkeypatch, caplog):
    monkeypatch.delenv("PUBSUB_EMULATOR_HOST")
    key = {"type": "service_account", "private_key": SECRET, "client_email": "a@b.iam.gserviceaccount.com"}
    monkeypatch.setenv(
        "AIRFLOW_CONN_BROKEN_KEY",
        json.dumps(
            {
                "conn_type": "google_cloud_platform",
                "extra": {"project": pubsub.project, "keyfile_dict": json.dumps(key)},
            }
        ),
    )
    caplog.set_level(logging.DEBUG)
    trigger = PubSubSharedStreamTrigger("orders", gcp_conn_id="broken_key")
    assert SECRET not in json.dumps(trigger.serialize())
    watcher = harness.add(trigger)
    error = await watcher.wait_for_error()
    assert isinstance(error, PubSubConfigurationError)
    assert "extra.keyfile_dict of connection 'broken_key' could not be loaded" in str(error)
    assert SECRET not in str(error)
    assert SECRET not in caplog.text


async def test_an_emulator_address_that_accepts_and_never_answers(pubsub, monkeypatch):
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        monkeypatch.setenv("PUBSUB_EMULATOR_HOST", f"127.0.0.1:{silent.getsockname()[1]}")
        producer = PubSubSharedStreamProducer(
            subscription="orders",
            project_id=pubsub.project,
            gcp_conn_id="google_cloud_default",
            dead_letter_topic=None,
            max_in_flight=10,
            rpc_timeout=3.0,
        )
        with pytest.raises(PubSubEndpointError, match="did not answer"):
            await anext(aiter(producer.open_stream()))
        await producer.aclose()


async def test_a_push_subscription_is_refused(pubsub, harness):
    from google.pubsub_v1 import PushConfig, Subscription

    topic = pubsub.create_topic()
    path = pubsub.subscription_path("push-" + topic.rsplit("-", 1)[1])
    pubsub.subscriber.create_subscription(
        request=Subscription(
            name=path, topic=topic, push_config=PushConfig(push_endpoint="http://127.0.0.1:9/push")
        )
    )
    watcher = harness.add(PubSubSharedStreamTrigger(path))
    error = await watcher.wait_for_error()
    assert isinstance(error, PubSubConfigurationError)
    assert "push subscription" in str(error)


async def test_a_subscription_deleted_mid_stream_fails_the_pull_by_name(pubsub, harness):
    """A call that fails mid-stream names itself and the subscription (the pull, or the ACK of the
    first message if its linger ends first)."""
    topic, subscription = pubsub.topic_with_subscription()
    watcher = harness.add(PubSubSharedStreamTrigger(subscription))
    pubsub.publish(topic, [{"n": 1}])
    await watcher.wait_for_events(1)
    pubsub.subscriber.delete_subscription(subscription=subscription)
    error = await watcher.wait_for_error()
    assert isinstance(error, PubSubNotFoundError), repr(error)
    assert re.match(rf"Pub/Sub (Pull|Acknowledge) on {subscription} \(connection ", str(error)), error
    assert "does not exist" in str(error)
