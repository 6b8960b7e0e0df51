"""Every spelling of one SQS queue is one stream key (docs/concepts.rst, "Stream identity")."""

from __future__ import annotations

import pytest

from airflow_shared_stream.sqs.errors import SqsConfigurationError
from airflow_shared_stream.sqs.hook import QueueUrl
from airflow_shared_stream.sqs.trigger import SqsSharedStreamTrigger

QUEUE = ("aws:us-east-1", "123456789012", "orders")


@pytest.mark.parametrize(
    "url",
    [
        "https://sqs.us-east-1.amazonaws.com/123456789012/orders",
        "https://us-east-1.queue.amazonaws.com/123456789012/orders",
        "https://queue.amazonaws.com/123456789012/orders",  # the legacy global host: us-east-1
        "HTTPS://SQS.US-EAST-1.AMAZONAWS.COM/123456789012/orders/",
        "https://sqs.us-east-1.amazonaws.com:443/123456789012/orders",
        "https://sqs-fips.us-east-1.amazonaws.com/123456789012/orders",
        "https://sqs.us-east-1.api.aws/123456789012/orders",  # dual-stack
        "https://vpce-0a1b2c3d-4e5f.sqs.us-east-1.vpce.amazonaws.com/123456789012/orders",
    ],
)
def test_every_aws_spelling_of_a_queue_is_one_identity(url):
    assert QueueUrl.parse(url).identity == QUEUE


@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1:4566/000000000000/orders",
        "HTTP://127.0.0.1:4566/000000000000/orders/",
    ],
)
def test_a_local_endpoint_is_its_host_and_port(url):
    assert QueueUrl.parse(url).identity == ("127.0.0.1:4566", "000000000000", "orders")


def test_default_ports_and_host_case_of_a_local_endpoint():
    assert (
        QueueUrl.parse("http://LocalHost/000000000000/q").identity
        == QueueUrl.parse("http://localhost:80/000000000000/q").identity
    )
    assert (
        QueueUrl.parse("https://sqs.internal.example/000000000000/q").identity
        == QueueUrl.parse("https://sqs.internal.example:443/000000000000/q").identity
    )


def test_what_names_another_queue_stays_apart():
    base = QueueUrl.parse("https://sqs.us-east-1.amazonaws.com/123456789012/orders").identity
    for other in (
        "https://sqs.eu-west-1.amazonaws.com/123456789012/orders",  # another region
        "https://sqs.us-east-1.amazonaws.com/210987654321/orders",  # another account
        "https://sqs.us-east-1.amazonaws.com/123456789012/Orders",  # SQS names are case-sensitive
    ):
        assert QueueUrl.parse(other).identity != base


def test_a_queue_name_is_refused_loudly_instead_of_becoming_a_stream_of_its_own():
    with pytest.raises(SqsConfigurationError, match="not an SQS queue URL"):
        SqsSharedStreamTrigger("orders")


def test_the_region_spelled_out_or_left_out_is_one_stream():
    url = "https://sqs.us-east-1.amazonaws.com/123456789012/orders"
    assert (
        SqsSharedStreamTrigger(url).shared_stream_key()
        == SqsSharedStreamTrigger(
            url.replace("sqs.us-east-1", "queue"), region_name="us-east-1"
        ).shared_stream_key()
    )
