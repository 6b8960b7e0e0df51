from __future__ import annotations

import importlib
import json

import pytest

from airflow_shared_stream.common.errors import StreamShapeConflictError
from airflow_shared_stream.sqs.errors import SqsConfigurationError
from airflow_shared_stream.sqs.hook import QueueUrl, SqsSharedStreamHook
from airflow_shared_stream.sqs.trigger import SqsSharedStreamTrigger

AWS_URL = "https://sqs.eu-west-1.amazonaws.com/123456789012/orders"


@pytest.mark.parametrize(
    ("url", "region", "fifo"),
    [
        (AWS_URL, "eu-west-1", False),
        ("https://eu-central-1.queue.amazonaws.com/123456789012/jobs.fifo", "eu-central-1", True),
        ("https://sqs.cn-north-1.amazonaws.com.cn/123456789012/q", "cn-north-1", False),
        ("http://127.0.0.1:4566/000000000000/local-queue", None, False),
        ("https://vpce-1a2b.sqs.us-east-1.vpce.amazonaws.com/123456789012/private", "us-east-1", False),
    ],
)
def test_queue_url_parsing(url, region, fifo):
    queue = QueueUrl.parse(url)
    assert queue.region_in_host == region
    assert queue.is_fifo is fifo


def _set_conn(monkeypatch, conn_id: str, **conn):
    monkeypatch.setenv(f"AIRFLOW_CONN_{conn_id.upper()}", json.dumps({"conn_type": "aws", **conn}))


async def test_client_config_reads_the_amazon_provider_conventions(monkeypatch):
    _set_conn(
        monkeypatch,
        "aws_unit",
        login="AKID",
        password="top-secret",
        extra={"region_name": "eu-west-2", "endpoint_url": "http://x:1", "aws_session_token": "tok"},
    )
    config = await SqsSharedStreamHook("aws_unit").aget_client_config(
        region_name=None, queue=QueueUrl.parse(AWS_URL)
    )
    assert config.client_kwargs() == {
        "region_name": "eu-west-2",
        "endpoint_url": "http://x:1",
        "aws_access_key_id": "AKID",
        "aws_secret_access_key": "top-secret",
        "aws_session_token": "tok",
    }
    assert "top-secret" not in repr(config)
    assert "tok" not in repr(config)


async def test_region_falls_back_to_the_queue_url_and_keys_to_the_default_chain(monkeypatch):
    _set_conn(monkeypatch, "aws_bare", extra={"service_config": {"sqs": {"endpoint_url": "http://y:2"}}})
    config = await SqsSharedStreamHook("aws_bare").aget_client_config(
        region_name=None, queue=QueueUrl.parse(AWS_URL)
    )
    assert config.client_kwargs() == {"region_name": "eu-west-1", "endpoint_url": "http://y:2"}


async def test_no_region_anywhere_is_a_clear_error(monkeypatch):
    _set_conn(monkeypatch, "aws_noregion")
    queue = QueueUrl.parse("http://127.0.0.1:4566/000000000000/q")
    with pytest.raises(SqsConfigurationError, match="no AWS region"):
        await SqsSharedStreamHook("aws_noregion").aget_client_config(region_name=None, queue=queue)


async def test_half_a_key_pair_is_refused_without_echoing_it(monkeypatch):
    _set_conn(monkeypatch, "aws_half", password="lonely-secret", extra={"region_name": "eu-west-1"})
    with pytest.raises(SqsConfigurationError, match="only one of login") as exc_info:
        await SqsSharedStreamHook("aws_half").aget_client_config(
            region_name=None, queue=QueueUrl.parse(AWS_URL)
        )
    assert "lonely-secret" not in str(exc_info.value)


def test_trigger_round_trips_through_serialize_and_the_key_is_the_queue_alone():
    trigger = SqsSharedStreamTrigger(AWS_URL, match="body.kind == 'a'", max_in_flight=50)
    classpath, kwargs = trigger.serialize()
    rebuilt = SqsSharedStreamTrigger(**json.loads(json.dumps(kwargs)))
    assert rebuilt.serialize() == (classpath, kwargs)
    sibling = SqsSharedStreamTrigger(AWS_URL, match="body.kind == 'b'", reject="body.bad")
    assert sibling.shared_stream_key() == trigger.shared_stream_key()
    # Issue 7 item 4: the connection and the region never split a stream (they must agree).
    for spelling in (
        SqsSharedStreamTrigger(AWS_URL, aws_conn_id="other"),
        SqsSharedStreamTrigger(AWS_URL, region_name="eu-west-1"),
        SqsSharedStreamTrigger(AWS_URL.replace("sqs.eu-west-1", "eu-west-1.queue")),
        SqsSharedStreamTrigger(AWS_URL.replace("https://sqs", "HTTPS://SQS") + "/"),
    ):
        assert spelling.shared_stream_key() == trigger.shared_stream_key()
    assert SqsSharedStreamTrigger(AWS_URL + "-other").shared_stream_key() != trigger.shared_stream_key()


def test_region_spelled_out_agrees_with_the_region_in_the_url_and_a_different_one_does_not():
    implicit = SqsSharedStreamTrigger(AWS_URL)
    explicit = SqsSharedStreamTrigger(AWS_URL, region_name="eu-west-1")
    SqsSharedStreamTrigger.check_shape_agrees(implicit.normalized_shape(), explicit.normalized_shape())
    with pytest.raises(StreamShapeConflictError, match="region_name='us-east-1'"):
        SqsSharedStreamTrigger.check_shape_agrees(
            implicit.normalized_shape(),
            SqsSharedStreamTrigger(AWS_URL, region_name="us-east-1").normalized_shape(),
        )
    with pytest.raises(StreamShapeConflictError, match="aws_conn_id='other'"):
        SqsSharedStreamTrigger.check_shape_agrees(
            implicit.normalized_shape(),
            SqsSharedStreamTrigger(AWS_URL, aws_conn_id="other").normalized_shape(),
        )


def test_producer_is_built_from_key_fields_without_connecting():
    _, kwargs = SqsSharedStreamTrigger(AWS_URL, dead_letter_queue_url=AWS_URL + "-dlq").serialize()
    producer = SqsSharedStreamTrigger.create_shared_stream_producer(kwargs)
    assert producer._client is None


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"dead_letter_queue_url": AWS_URL}, "must differ"),
        ({"wait_time_seconds": 0}, "wait_time_seconds"),
        ({"wait_time_seconds": 21}, "wait_time_seconds"),
        ({"aws_conn_id": ""}, "aws_conn_id"),
        ({"dead_letter_queue_url": "https://example.com/x"}, "not an SQS queue URL"),
    ],
)
def test_bad_arguments_are_refused_at_construction(kwargs, message):
    with pytest.raises(SqsConfigurationError, match=message):
        SqsSharedStreamTrigger(AWS_URL, **kwargs)


@pytest.mark.parametrize("module", ["airflow_shared_stream.sqs", "airflow_shared_stream.sqs.hook"])
def test_the_old_hook_name_is_the_same_class_with_a_deprecation_warning(module):
    from airflow.exceptions import AirflowProviderDeprecationWarning

    package = importlib.import_module(module)
    with pytest.warns(AirflowProviderDeprecationWarning, match="SqsSharedStreamHook") as warned:
        old = package.SqsHook
    assert old is SqsSharedStreamHook
    assert warned[0].filename == __file__, "the warning points at the caller"
