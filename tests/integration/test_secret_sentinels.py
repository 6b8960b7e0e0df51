"""
A sentinel secret in every credential field of every broker's connection never leaks.

One module for all four brokers (each on its real test broker, through the reliability rigs of
tests/reliability/brokers.py): the sentinel goes into every field that holds a secret

=============  ===========================================================================
SQS            password (secret access key), extra ``aws_session_token``
Kafka          password, extra ``sasl.password`` (SASL/PLAIN: noida-db accepts any password)
Pub/Sub        extra ``keyfile_dict`` (a service-account key whose private key is the sentinel)
Service Bus    the connection string's ``SharedAccessKey`` (the fake checks the signature)
=============  ===========================================================================

and the test looks for it in everything the provider produces: logs at DEBUG (ours, Airflow's,
the SDKs'), ``serialize()`` output, trigger event payloads, metrics (a real StatsD listener),
and exception text (message, repr, the whole cause chain and traceback), on a working stream
and on failures: an endpoint where nothing listens, credentials the broker refuses, and a
credential or TLS/SASL option set wrong (which must fail with an error naming it).
The contract's ConnectionContract (tests/integration/contract/connection.py) checks each
failure's error kind for every broker; the per-broker modules (test_*errors_and_secrets.py,
Kafka's test_kafka_failures.py) keep what is broker-specific: which error class, what message.
"""

from __future__ import annotations

import asyncio
import json
import logging
import sys
import traceback
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from airflow_shared_stream.common.errors import SharedStreamConfigurationError
from airflow_shared_stream.kafka import KafkaSharedStreamTrigger
from airflow_shared_stream.pubsub import PubSubSharedStreamTrigger
from airflow_shared_stream.servicebus import ServiceBusSharedStreamTrigger
from airflow_shared_stream.sqs import SqsSharedStreamTrigger
from airflow_shared_stream.testing import SharedStreamHarness
from tests.reliability.brokers import BROKERS, BrokerRig, broker_rig
from tests.support.processes import free_port, running, wait_for_port
from tests.support.statsd import StatsdListener

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

SENTINEL = "SeNtInEl7c1d9e4bQ"
"""Valid in every field (an AWS secret, a SASL password, a SAS key), and found by substring."""
CONN_ID = "sentinel_conn"
FAKE_PEM = f"-----BEGIN PRIVATE KEY-----\n{SENTINEL}\n-----END PRIVATE KEY-----\n"


@pytest.fixture(scope="module", params=BROKERS)
def rig(request: pytest.FixtureRequest) -> Iterator[BrokerRig]:
    with broker_rig(request.param) as running_rig:
        yield running_rig


@pytest.fixture
def observed(caplog: pytest.LogCaptureFixture, statsd: StatsdListener) -> Callable[[], str]:
    """Everything the provider logged or sent as metrics so far, as one text to search."""
    caplog.set_level(logging.DEBUG)
    return lambda: caplog.text + "\n" + "\n".join(statsd.read())


# -- per broker: a connection with the sentinel in every secret, and a trigger using it -------


def sentinel_connection(
    rig: BrokerRig, *, failure: str | None = None, auth_endpoint: str | None = None
) -> dict[str, Any]:
    """
    ``rig``'s connection with the sentinel in every secret field. ``failure``: ``"endpoint"``
    (nothing listens there) or ``"auth"`` (the broker refuses the credentials).
    """
    dead = f"127.0.0.1:{free_port()}"
    if rig.name == "sqs":
        endpoint = {"endpoint": f"http://{dead}", "auth": auth_endpoint}.get(failure or "")
        return {
            "conn_type": "aws",
            "login": "AKIDSENTINELTEST",
            "password": SENTINEL,
            "extra": {
                "region_name": "us-east-1",
                "endpoint_url": endpoint or rig.contract.sqs.endpoint_url,
                "aws_session_token": SENTINEL,
            },
        }
    if rig.name == "kafka":
        bootstrap = dead if failure == "endpoint" else rig.contract.kafka.bootstrap
        return {
            "conn_type": "kafka",
            "login": "svc",
            "password": SENTINEL,
            "extra": {
                "bootstrap.servers": bootstrap,
                "security.protocol": "SASL_PLAINTEXT",
                # noida-db accepts any PLAIN password and refuses SCRAM: the refusal takes the
                # client's bad-credentials path.
                "sasl.mechanism": "SCRAM-SHA-512" if failure == "auth" else "PLAIN",
                "sasl.username": "svc",
                "sasl.password": SENTINEL,
                "auto.offset.reset": "earliest",
                "request.timeout.ms": "12000",
            },
        }
    if rig.name == "pubsub":
        key = {
            "type": "service_account",
            "project_id": rig.contract.pubsub.project,
            "private_key_id": SENTINEL,
            "private_key": FAKE_PEM,
            "client_email": "sentinel@example.iam.gserviceaccount.com",
            "token_uri": f"http://{dead}/token",
        }
        return {
            "conn_type": "google_cloud_platform",
            "extra": {"project": rig.contract.pubsub.project, "keyfile_dict": json.dumps(key)},
        }
    if rig.name == "servicebus":
        server = rig.contract.server
        server.sas_keys["SentinelKey"] = "not-the-sentinel" if failure == "auth" else SENTINEL
        port = int(dead.rsplit(":", 1)[1]) if failure == "endpoint" else server.port
        return {
            "conn_type": "azure_service_bus",
            "schema": f"Endpoint=sb://127.0.0.1:{port};SharedAccessKeyName=SentinelKey;"
            f"SharedAccessKey={SENTINEL};UseDevelopmentEmulator=true;",
        }
    raise AssertionError(rig.name)


def sentinel_trigger(rig: BrokerRig, stream: Any, **kwargs: Any) -> Any:
    if rig.name == "sqs":
        return SqsSharedStreamTrigger(
            stream.url, dead_letter_queue_url=stream.dead_letter_url, aws_conn_id=CONN_ID, **kwargs
        )
    if rig.name == "kafka":
        kwargs = {k: v.replace("body.", "value.") for k, v in kwargs.items()}
        return KafkaSharedStreamTrigger(
            [stream.topic],
            kafka_config_id=CONN_ID,
            group_id=stream.group,
            dead_letter_topic=stream.dead_letter_topic,
            **kwargs,
        )
    if rig.name == "pubsub":
        return PubSubSharedStreamTrigger(
            stream.subscription, dead_letter_topic=stream.dead_letter_topic, gcp_conn_id=CONN_ID, **kwargs
        )
    return ServiceBusSharedStreamTrigger(
        stream.queue, azure_service_bus_conn_id=CONN_ID, max_wait_time=1, **kwargs,
    )  # fmt: skip


# -- the checks ---------------------------------------------------------------------------------


def exception_text(error: BaseException) -> str:
    """Message, repr, and the whole chain with its traceback, as a user's log would show."""
    return "\n".join([str(error), repr(error), *traceback.format_exception(error)])


def assert_no_sentinel(where: str, text: str) -> None:
    assert SENTINEL not in text, f"the secret leaked into {where}: ...{_around(text)}..."


def _around(text: str) -> str:
    at = text.find(SENTINEL)
    return text[max(0, at - 200) : at + 60]


@pytest.fixture
def auth_endpoint(rig: BrokerRig, tmp_path: Any) -> Iterator[str | None]:
    """SQS only: a moto server that checks signatures (the in-process one accepts any)."""
    if rig.name != "sqs":
        yield None
        return
    port = free_port()
    argv = [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)]
    with running(argv, log_path=tmp_path / "moto.log", env={"INITIAL_NO_AUTH_ACTION_COUNT": "0"}) as proc:
        wait_for_port(port, timeout=60, proc=proc, what="authenticating moto server")
        yield f"http://127.0.0.1:{port}"


async def test_a_working_stream_never_shows_the_secret(rig, observed, monkeypatch):
    monkeypatch.setenv(f"AIRFLOW_CONN_{CONN_ID.upper()}", json.dumps(sentinel_connection(rig)))
    stream = rig.contract.create_stream()
    trigger = sentinel_trigger(rig, stream, reject="body.bad")
    assert_no_sentinel("serialize()", json.dumps(trigger.serialize()))
    async with SharedStreamHarness(confirm_after=0.0) as harness:
        watcher = harness.add(trigger)
        rig.contract.publish(stream, [{"n": 1}, {"bad": True}, {"n": 2}])
        await watcher.wait_for_events(2, timeout=60)
        dead: list[Any] = []
        for _ in range(100):
            dead += rig.contract.dead_letters(stream)
            if dead:
                break
            await asyncio.sleep(0.2)
    assert dead == [{"bad": True}], "the stream did not work end to end: the test would prove nothing"
    assert_no_sentinel("trigger event payloads", json.dumps(watcher.payloads))
    assert_no_sentinel("logs or metrics", observed())
    assert "received" in observed(), "no metric reached the listener: the metrics check is blind"


@pytest.mark.parametrize("failure", ["endpoint", "auth"])
async def test_a_failing_connection_never_shows_the_secret(
    rig, failure, observed, monkeypatch, auth_endpoint
):
    connection = sentinel_connection(rig, failure=failure, auth_endpoint=auth_endpoint)
    monkeypatch.setenv(f"AIRFLOW_CONN_{CONN_ID.upper()}", json.dumps(connection))
    if rig.name == "pubsub":
        # The emulator takes no credentials: the key is used (and refused) only against "Google".
        if failure == "endpoint":
            monkeypatch.setenv("PUBSUB_EMULATOR_HOST", f"127.0.0.1:{free_port()}")
        else:
            monkeypatch.delenv("PUBSUB_EMULATOR_HOST")
    stream = rig.contract.create_stream()
    trigger = sentinel_trigger(rig, stream)
    assert_no_sentinel("serialize()", json.dumps(trigger.serialize()))
    async with SharedStreamHarness(confirm_after=0.0) as harness:
        watcher = harness.add(trigger)
        error = await watcher.wait_for_error(timeout=120)
    assert_no_sentinel("the exception", exception_text(error))
    assert_no_sentinel("logs or metrics", observed())


def misconfigured_connection(rig: BrokerRig) -> tuple[dict[str, Any], str]:
    """A credential or TLS/SASL option set wrong, the sentinel beside it; and what the error names."""
    if rig.name == "sqs":  # a secret key without its key id
        connection = sentinel_connection(rig)
        del connection["login"]
        return connection, "only one of login"
    if rig.name == "kafka":  # a SASL mechanism aiokafka cannot do, over TLS
        connection = sentinel_connection(rig)
        connection["extra"].update({"security.protocol": "SASL_SSL", "sasl.mechanism": "GSSAPI"})
        return connection, "sasl.mechanism"
    if rig.name == "pubsub":  # a key that is not a service-account JSON object
        extra = {"project": rig.contract.pubsub.project, "keyfile_dict": "{" + SENTINEL}
        return {"conn_type": "google_cloud_platform", "extra": extra}, "not a JSON object"
    schema = f"Endpoint=nonsense;SharedAccessKeyName=SentinelKey;SharedAccessKey={SENTINEL}"
    return {"conn_type": "azure_service_bus", "schema": schema}, "not a Service Bus connection string"


async def test_a_misconfigured_credential_is_named_without_the_secret(rig, observed, monkeypatch):
    connection, names = misconfigured_connection(rig)
    monkeypatch.setenv(f"AIRFLOW_CONN_{CONN_ID.upper()}", json.dumps(connection))
    if rig.name == "pubsub":
        monkeypatch.delenv("PUBSUB_EMULATOR_HOST")  # the emulator would take no key at all
    stream = rig.contract.create_stream()
    async with SharedStreamHarness(confirm_after=0.0) as harness:
        watcher = harness.add(sentinel_trigger(rig, stream))
        error = await watcher.wait_for_error(timeout=60)
    assert isinstance(error, SharedStreamConfigurationError), repr(error)
    assert names in str(error)
    assert_no_sentinel("the exception", exception_text(error))
    assert_no_sentinel("logs or metrics", observed())
