"""Bad configuration and broker outages: clear errors, no secrets, clean recovery."""

from __future__ import annotations

import json
import logging
import tempfile
from pathlib import Path

import pytest

from airflow_shared_stream.kafka.errors import KafkaSharedStreamError
from airflow_shared_stream.kafka.trigger import KafkaSharedStreamTrigger
from airflow_shared_stream.testing import SharedStreamHarness
from tests.support.kafka_brokers import run_kafka_broker
from tests.support.processes import free_port
from tests.support.tcp_recorder import RecordingTcpProxy

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

SECRET = "Pa55-w0rd-that-must-never-leak"


def set_connection(monkeypatch, conn_id: str, extra: dict, password: str | None = None) -> None:
    conn = {"conn_type": "kafka", "extra": extra}
    if password is not None:
        conn.update(login="svc", password=password)
    monkeypatch.setenv(f"AIRFLOW_CONN_{conn_id.upper()}", json.dumps(conn))


async def run_until_error(trigger) -> BaseException:
    async with SharedStreamHarness() as h:
        return await h.add(trigger).wait_for_error(timeout=60)


def assert_no_secret(error: BaseException, caplog, trigger) -> None:
    assert SECRET not in str(error)
    assert SECRET not in repr(error)
    assert SECRET not in caplog.text
    assert SECRET not in json.dumps(trigger.serialize())


async def test_auto_commit_configuration_refused(kafka, monkeypatch):
    topic = kafka.name("t")
    await kafka.create_topics(topic)
    conn_id = kafka.name("autocommit").replace("-", "_")
    set_connection(monkeypatch, conn_id, {"bootstrap.servers": kafka.bootstrap, "enable.auto.commit": "true"})
    error = await run_until_error(KafkaSharedStreamTrigger([topic], kafka_config_id=conn_id))
    assert "enable.auto.commit" in str(error)


async def test_missing_topic_is_a_clear_error(kafka):
    missing = kafka.name("nope")
    error = await run_until_error(KafkaSharedStreamTrigger([missing], kafka_config_id=kafka.conn_id))
    assert isinstance(error, KafkaSharedStreamError)
    assert f"Kafka topic(s) {missing} do not exist on {kafka.bootstrap}" in str(error)


async def test_missing_dead_letter_topic_is_a_clear_error(kafka):
    topic = kafka.name("t")
    await kafka.create_topics(topic)
    trigger = KafkaSharedStreamTrigger(
        [topic], kafka_config_id=kafka.conn_id, dead_letter_topic=kafka.name("dlq")
    )
    error = await run_until_error(trigger)
    assert "dead-letter topic" in str(error)


async def test_sasl_refused_by_broker_leaks_no_secret(kafka, monkeypatch, caplog):
    # Neither broker here verifies SCRAM credentials; both refuse the mechanism, which takes the
    # same path in the client as bad credentials: the connection fails during authentication.
    caplog.set_level(logging.DEBUG)
    topic = kafka.name("t")
    await kafka.create_topics(topic)
    conn_id = kafka.name("scram").replace("-", "_")
    extra = {"bootstrap.servers": kafka.bootstrap, "security.protocol": "SASL_PLAINTEXT",
             "sasl.mechanism": "SCRAM-SHA-512", "sasl.username": "svc", "sasl.password": SECRET}  # fmt: skip
    set_connection(monkeypatch, conn_id, extra)
    trigger = KafkaSharedStreamTrigger([topic], kafka_config_id=conn_id)
    error = await run_until_error(trigger)
    assert isinstance(error, KafkaSharedStreamError)
    assert f"cannot connect to Kafka at {kafka.bootstrap}" in str(error)
    assert_no_secret(error, caplog, trigger)


async def test_sasl_plain_sends_the_connection_credentials_and_logs_none(kafka, monkeypatch, caplog):
    """
    The connection's login and password are what the client authenticates with; no log has them.

    Neither broker here checks credentials (noida-db accepts any SASL/PLAIN password; Tansu
    without ``--authentication`` speaks no SASL, and its in-memory user store cannot be filled
    while authentication is on), so a wrong password would pass against the broker alone. The
    bytes on the wire are read instead: the PLAIN token must carry this connection's password.
    """
    caplog.set_level(logging.DEBUG)
    topic = kafka.name("t")
    await kafka.create_topics(topic)
    await kafka.produce(topic, ["hello"])
    conn_id = kafka.name("plain").replace("-", "_")
    async with RecordingTcpProxy(kafka.broker.port) as proxy:
        extra = {"bootstrap.servers": f"127.0.0.1:{proxy.port}", "security.protocol": "SASL_PLAINTEXT",
                 "sasl.mechanism": "PLAIN", "auto.offset.reset": "earliest"}  # fmt: skip
        set_connection(monkeypatch, conn_id, extra, password=SECRET)
        trigger = KafkaSharedStreamTrigger([topic], kafka_config_id=conn_id, group_id=kafka.name("g"))
        async with SharedStreamHarness() as h:
            w = h.add(trigger)
            if kafka.broker.name == "noida-db":
                await w.wait_for_events(1)
                assert w.payloads[0]["value"] == "hello"
                # RFC 4616: authzid NUL authcid NUL passwd, from the connection's login/password.
                assert b"\x00svc\x00" + SECRET.encode() in proxy.sent
            else:  # Tansu without --authentication refuses the SASL handshake itself
                error = await w.wait_for_error(timeout=60)
                assert f"cannot connect to Kafka at 127.0.0.1:{proxy.port}" in str(error)
                assert_no_secret(error, caplog, trigger)
                assert SECRET.encode() not in proxy.sent  # refused before any credential was sent
    assert SECRET not in caplog.text


async def test_unreachable_broker_then_recovery(kafka_broker, monkeypatch, caplog):
    """A broker that is down fails the group with a clear error; once it is up, a new group runs."""
    caplog.set_level(logging.DEBUG)
    port = free_port()
    bootstrap = f"127.0.0.1:{port}"
    extra = {"bootstrap.servers": bootstrap, "security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "PLAIN",
             "auto.offset.reset": "earliest"}  # fmt: skip
    if kafka_broker.name == "tansu":
        extra = {"bootstrap.servers": bootstrap, "auto.offset.reset": "earliest"}
    set_connection(monkeypatch, "kafka_outage", extra, password=SECRET)
    trigger = KafkaSharedStreamTrigger(["events"], kafka_config_id="kafka_outage", group_id="outage")

    error = await run_until_error(trigger)
    assert isinstance(error, KafkaSharedStreamError)
    assert f"cannot connect to Kafka at {bootstrap}" in str(error)
    assert_no_secret(error, caplog, trigger)

    work_dir = Path(tempfile.mkdtemp(prefix=f"kafka-outage-{kafka_broker.name}-"))
    with run_kafka_broker(kafka_broker.name, work_dir, port=port) as broker:
        from tests.integration.kafka.conftest import KafkaSandbox

        sandbox = KafkaSandbox(broker=broker, conn_id="kafka_outage", prefix="outage")
        await sandbox.create_topics("events")
        await sandbox.produce("events", ["back"])
        async with SharedStreamHarness() as h:
            w = h.add(trigger)
            await w.wait_for_events(1, timeout=60)
            assert w.payloads[0]["value"] == "back"
    assert SECRET not in caplog.text
