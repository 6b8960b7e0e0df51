"""Kafka's error translation: the common kinds, the connection named, never a secret."""

from __future__ import annotations

from aiokafka.errors import KafkaConnectionError, SaslAuthenticationFailed, TopicAuthorizationFailedError

from airflow_shared_stream.common.errors import SharedStreamAccessError, SharedStreamEndpointError
from airflow_shared_stream.kafka.errors import KafkaErrorTranslator, KafkaSharedStreamError

SECRET = "hunter2-sasl"


def translator() -> KafkaErrorTranslator:
    errors = KafkaErrorTranslator("kafka_prod")
    errors.scrubber.add(SECRET)
    return errors


def test_a_refused_login_is_an_access_error_naming_the_connection_not_the_secret():
    error = translator().connect_failed("b1:9093", SaslAuthenticationFailed(f"bad password {SECRET}"))
    assert isinstance(error, SharedStreamAccessError)
    assert isinstance(error, KafkaSharedStreamError)
    assert "b1:9093" in str(error)
    assert "'kafka_prod'" in str(error)
    assert SECRET not in str(error)


def test_an_unreachable_cluster_is_an_endpoint_error():
    error = translator().connect_failed("b1:9093", KafkaConnectionError("no route"))
    assert isinstance(error, SharedStreamEndpointError)
    assert not isinstance(error, SharedStreamAccessError)


def test_other_client_errors_keep_the_base_kind_and_are_scrubbed():
    error = translator()("reading from Kafka failed", TopicAuthorizationFailedError(SECRET))
    assert type(error) is KafkaSharedStreamError
    assert str(error).startswith("reading from Kafka failed (connection 'kafka_prod'): ")
    assert SECRET not in str(error)
