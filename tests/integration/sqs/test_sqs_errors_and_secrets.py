"""Bad input gives a clear error naming the problem, and no credential ever leaks."""

from __future__ import annotations

import json
import logging
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer

import pytest

from airflow_shared_stream.common.errors import SharedStreamConfigurationError
from airflow_shared_stream.sqs.errors import (
    SqsAccessError,
    SqsConfigurationError,
    SqsEndpointError,
)
from airflow_shared_stream.sqs.trigger import SqsSharedStreamTrigger
from tests.integration.sqs.conftest import ACCESS_KEY, REGION, SECRET_KEY

pytestmark = pytest.mark.integration


async def test_missing_connection_is_named(sqs, harness, monkeypatch):
    monkeypatch.delenv("AIRFLOW_CONN_AWS_NOWHERE", raising=False)
    watcher = harness.add(SqsSharedStreamTrigger(sqs.create_queue(), aws_conn_id="aws_nowhere"))
    error = await watcher.wait_for_error()
    assert isinstance(error, SqsConfigurationError)
    assert "'aws_nowhere' is not defined" in str(error)


def test_bad_expressions_are_refused_at_construction():
    url = "https://sqs.us-east-1.amazonaws.com/123456789012/orders"
    with pytest.raises(SharedStreamConfigurationError, match="match is not a valid JMESPath expression"):
        SqsSharedStreamTrigger(url, match="body.[")
    with pytest.raises(SharedStreamConfigurationError, match="max_in_flight must be between 1 and"):
        SqsSharedStreamTrigger(url, max_in_flight=100_000)


class _NotSqs(BaseHTTPRequestHandler):
    def do_POST(self):  # an ordinary web server: HTML, not the SQS protocol
        body = b"<html><body>hello</body></html>"
        self.send_response(200)
        self.send_header("Content-Type", "text/html")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


async def test_an_http_server_that_is_not_sqs_is_named(harness, monkeypatch):
    """A closed port is the contract's (ConnectionContract); a web server answering HTML is SQS's own."""
    server = HTTPServer(("127.0.0.1", 0), _NotSqs)
    port = server.server_address[1]
    threading.Thread(target=server.serve_forever, daemon=True).start()
    conn = {
        "conn_type": "aws",
        "login": ACCESS_KEY,
        "password": SECRET_KEY,
        "extra": {"region_name": REGION, "endpoint_url": f"http://127.0.0.1:{port}"},
    }
    monkeypatch.setenv("AIRFLOW_CONN_AWS_ELSEWHERE", json.dumps(conn))
    try:
        queue_url = f"http://127.0.0.1:{port}/123456789012/orders"
        watcher = harness.add(SqsSharedStreamTrigger(queue_url, aws_conn_id="aws_elsewhere"))
        error = await watcher.wait_for_error(timeout=90)
    finally:
        server.shutdown()
    assert isinstance(error, SqsEndpointError)
    assert "did not answer as SQS" in str(error)
    assert SECRET_KEY not in str(error)


async def test_a_role_sts_refuses_fails_the_stream_and_never_falls_back_to_the_keys(
    authenticating_sqs, harness, monkeypatch, caplog
):
    role = "arn:aws:iam::123456789012:role/not-for-you"
    conn = {
        "conn_type": "aws",
        "login": ACCESS_KEY,
        "password": SECRET_KEY,
        "extra": {
            "region_name": REGION,
            "endpoint_url": authenticating_sqs,
            "role_arn": role,
            "service_config": {"sts": {"endpoint_url": authenticating_sqs}},
        },
    }
    monkeypatch.setenv("AIRFLOW_CONN_AWS_REFUSED_ROLE", json.dumps(conn))
    with caplog.at_level(logging.DEBUG):
        watcher = harness.add(
            SqsSharedStreamTrigger(
                f"{authenticating_sqs}/123456789012/orders", aws_conn_id="aws_refused_role"
            )
        )
        error = await watcher.wait_for_error()
    assert isinstance(error, SqsAccessError)
    assert f"STS refused to let connection 'aws_refused_role' assume role {role}" in str(error)
    assert SECRET_KEY not in str(error)
    assert SECRET_KEY not in caplog.text
