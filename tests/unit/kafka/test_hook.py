"""Translating a ``kafka`` connection (librdkafka spelling) into aiokafka arguments."""

from __future__ import annotations

import importlib
import json
import ssl

import pytest
from airflow.exceptions import AirflowProviderDeprecationWarning

from airflow_shared_stream.kafka.errors import KafkaConfigurationError
from airflow_shared_stream.kafka.hook import KafkaSharedStreamHook, client_config_from_extra

SECRET = "s3cr3t-Pa55"


def test_plaintext_minimal():
    config = client_config_from_extra({"bootstrap.servers": "a:1, b:2", "group.id": "g"})
    assert config.common == {"bootstrap_servers": ["a:1", "b:2"], "security_protocol": "PLAINTEXT"}
    assert config.group_id == "g"
    kwargs = config.consumer_kwargs("override")
    assert kwargs["group_id"] == "override"
    assert kwargs["enable_auto_commit"] is False
    assert kwargs["auto_offset_reset"] == "latest"
    assert kwargs["check_crcs"] is False  # librdkafka's default
    assert client_config_from_extra({"bootstrap.servers": "a:1", "check.crcs": "true"}).consumer["check_crcs"]


@pytest.mark.parametrize("mechanism", ["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"])
def test_sasl_plaintext(mechanism):
    config = client_config_from_extra(
        {
            "bootstrap.servers": "a:1",
            "security.protocol": "sasl_plaintext",
            "sasl.mechanisms": mechanism,
            "sasl.username": "u",
            "sasl.password": SECRET,
        }
    )
    kwargs = config.consumer_kwargs("g")
    assert kwargs["security_protocol"] == "SASL_PLAINTEXT"
    assert kwargs["sasl_mechanism"] == mechanism
    assert kwargs["sasl_plain_username"] == "u"
    assert kwargs["sasl_plain_password"] == SECRET
    assert SECRET not in repr(config)
    assert config.secrets == (SECRET,)


def test_sasl_password_from_connection_fields():
    config = client_config_from_extra(
        {"bootstrap.servers": "a:1", "security.protocol": "SASL_SSL", "sasl.mechanism": "SCRAM-SHA-512"},
        login="user",
        password=SECRET,
    )
    kwargs = config.producer_kwargs()
    assert kwargs["sasl_plain_username"] == "user"
    assert kwargs["sasl_plain_password"] == SECRET
    assert isinstance(kwargs["ssl_context"], ssl.SSLContext)
    assert kwargs["acks"] == "all"


def test_ssl_settings(tmp_path):
    config = client_config_from_extra(
        {
            "bootstrap.servers": "a:1",
            "security.protocol": "SSL",
            "ssl.endpoint.identification.algorithm": "none",
            "enable.ssl.certificate.verification": "false",
        }
    )
    context = config.common["ssl_context"]
    assert context.check_hostname is False
    assert context.verify_mode == ssl.CERT_NONE


def test_consumer_tuning():
    config = client_config_from_extra(
        {
            "bootstrap.servers": "a:1",
            "auto.offset.reset": "smallest",
            "session.timeout.ms": "12000",
            "request.timeout.ms": 5000,
            "partition.assignment.strategy": "cooperative-sticky",  # no membership: not forwarded
            "isolation.level": "READ_UNCOMMITTED",
            "linger.ms": 5,
        }
    )
    kwargs = config.consumer_kwargs("g")
    assert kwargs["auto_offset_reset"] == "earliest"
    assert kwargs["session_timeout_ms"] == 12000
    assert kwargs["request_timeout_ms"] == 5000
    assert config.producer_kwargs()["request_timeout_ms"] == 5000
    assert "partition_assignment_strategy" not in kwargs
    assert kwargs["isolation_level"] == "read_uncommitted"
    assert config.ignored == ("linger.ms",)


def test_isolation_level_defaults_to_read_committed_as_in_librdkafka():
    """aiokafka's own default would fire events for aborted transactions."""
    kwargs = client_config_from_extra({"bootstrap.servers": "a:1"}).consumer_kwargs("g")
    assert kwargs["isolation_level"] == "read_committed"


@pytest.mark.parametrize("value", ["true", True, "1", "TRUE"])
def test_auto_commit_refused(value):
    with pytest.raises(KafkaConfigurationError, match=r"enable\.auto\.commit"):
        client_config_from_extra({"bootstrap.servers": "a:1", "enable.auto.commit": value})


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({}, "bootstrap.servers"),
        ({"bootstrap.servers": "a:1", "security.protocol": "SASL_GSSAPI"}, "security.protocol"),
        (
            {"bootstrap.servers": "a:1", "security.protocol": "SASL_SSL", "sasl.mechanism": "GSSAPI"},
            "sasl.mechanism",
        ),
        ({"bootstrap.servers": "a:1", "security.protocol": "SASL_PLAINTEXT"}, "sasl.username"),
        ({"bootstrap.servers": "a:1", "session.timeout.ms": "soon"}, "integer"),
        ({"bootstrap.servers": "a:1", "isolation.level": "dirty"}, "isolation.level"),
    ],
)
def test_bad_settings_are_refused_without_secrets(extra, message):
    extra = {**extra, "sasl.password": SECRET} if "sasl.username" not in message else extra
    with pytest.raises(KafkaConfigurationError, match=message) as info:
        client_config_from_extra(extra)
    assert SECRET not in str(info.value)


async def test_hook_reads_airflow_connection(monkeypatch):
    extra = {"bootstrap.servers": "h:9", "security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "PLAIN"}
    monkeypatch.setenv(
        "AIRFLOW_CONN_KAFKA_UNIT",
        json.dumps({"conn_type": "kafka", "login": "svc", "password": SECRET, "extra": extra}),
    )
    config = await KafkaSharedStreamHook("kafka_unit").aget_client_config()
    assert config.common["sasl_plain_username"] == "svc"
    assert config.common["bootstrap_servers"] == ["h:9"]
    assert SECRET not in repr(config)


def test_aiokafka_log_scrubbing_starts_with_a_stream_and_does_not_pile_up():
    import logging

    from airflow_shared_stream.kafka import hook

    conn_logger = logging.getLogger("aiokafka.conn")
    before = len(conn_logger.filters)
    extra = {"bootstrap.servers": "a:1", "security.protocol": "SASL_PLAINTEXT", "sasl.username": "u"}
    for _ in range(2):  # two stream starts
        hook.protect_secrets(client_config_from_extra({**extra, "sasl.password": SECRET}))
    assert len(conn_logger.filters) - before <= 1
    record = logging.LogRecord(
        "aiokafka.conn", logging.DEBUG, __file__, 1, "sent %r", (SECRET.encode(),), None
    )
    for log_filter in conn_logger.filters:
        log_filter.filter(record) if isinstance(log_filter, logging.Filter) else log_filter(record)
    assert SECRET not in record.getMessage()


@pytest.mark.parametrize(
    ("module", "old", "new"),
    [
        ("airflow_shared_stream.kafka", "KafkaHook", "KafkaSharedStreamHook"),
        ("airflow_shared_stream.kafka", "KafkaConfigError", "KafkaConfigurationError"),
        ("airflow_shared_stream.kafka.hook", "KafkaHook", "KafkaSharedStreamHook"),
        ("airflow_shared_stream.kafka.hook", "KafkaConfigError", "KafkaConfigurationError"),
        ("airflow_shared_stream.kafka.errors", "KafkaConfigError", "KafkaConfigurationError"),
    ],
)
def test_old_names_still_work_with_a_deprecation_warning(module, old, new):
    imported = importlib.import_module(module)
    with pytest.warns(AirflowProviderDeprecationWarning, match=new):
        assert getattr(imported, old) is getattr(imported, new)


def test_a_configuration_error_is_the_common_kind():
    from airflow_shared_stream.common.errors import SharedStreamConfigurationError

    assert issubclass(KafkaConfigurationError, SharedStreamConfigurationError)
