"""
No secret of an SQS connection's identity reaches a log line, botocore's DEBUG included
(FAULT_MODEL class 12), on the paths the trigger's own test does not walk: a profile signed in
with IAM Identity Center (SSO), and the Streams page's depth read as a role.

botocore logs every request it makes at DEBUG (``botocore.endpoint``: "Making request ... with
params", its headers included, and "Sending http request", the prepared request's headers), and
the canonical request it signs (``botocore.auth``). The provider's STS filter redacts the keys in
STS and SSO *answers*; the connection's scrubber removes what it was told.
"""

from __future__ import annotations

import hashlib
import json
import logging
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer
from typing import Any

import boto3
import pytest

from airflow_shared_stream.sqs.operations import queue_depth
from airflow_shared_stream.sqs.trigger import SqsSharedStreamTrigger
from tests.integration.sqs.conftest import REGION, SECRET_KEY
from tests.integration.sqs.test_sqs_identity import _assumed_roles, _role_connection, _role_queue, proxy  # noqa: F401

pytestmark = pytest.mark.integration

SSO_START_URL = "https://shared-stream-test.awsapps.com/start"
SSO_ACCESS_TOKEN = "sso-portal-bearer-token-never-logged-51e2"
"""The IAM Identity Center access token ``aws sso login`` cached: it gets role keys for every
account and role the person may use, for hours."""
SSO_ROLE_SECRET = "sso-role-secret-never-logged-7b0c"
SSO_ROLE_TOKEN = "sso-role-session-token-never-logged-e44a"


def _answer_json(handler: BaseHTTPRequestHandler, body: bytes) -> None:
    handler.send_response(200)
    handler.send_header("Content-Type", "application/json")
    handler.send_header("Content-Length", str(len(body)))
    handler.end_headers()
    handler.wfile.write(body)


class _SsoPortal(BaseHTTPRequestHandler):
    """
    The IAM Identity Center portal's ``GetRoleCredentials`` (``GET /federation/credentials``),
    answered as the service documents it. botocore logs the request before any answer: the
    answer only lets the stream go on to SQS.
    """

    tokens: list[str] = []

    def do_GET(self) -> None:
        self.tokens.append(self.headers.get("x-amz-sso_bearer_token", ""))
        body = json.dumps(
            {
                "roleCredentials": {
                    "accessKeyId": "ASIASSOSTREAMTEST",
                    "secretAccessKey": SSO_ROLE_SECRET,
                    "sessionToken": SSO_ROLE_TOKEN,
                    "expiration": int((time.time() + 3600) * 1000),
                }
            }
        ).encode()
        _answer_json(self, body)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def sso_profile(tmp_path, monkeypatch) -> Iterator[str]:
    """A profile signed in with IAM Identity Center on the triggerer (legacy ``sso_start_url``)."""
    server = HTTPServer(("127.0.0.1", 0), _SsoPortal)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    _SsoPortal.tokens = []
    config = tmp_path / "config"
    config.write_text(
        "[profile sso-reader]\n"
        f"sso_start_url = {SSO_START_URL}\n"
        f"sso_region = {REGION}\n"
        "sso_account_id = 123456789012\n"
        "sso_role_name = reader\n"
        f"region = {REGION}\n"
    )
    cache = tmp_path / ".aws" / "sso" / "cache"
    cache.mkdir(parents=True)
    (cache / f"{hashlib.sha1(SSO_START_URL.encode()).hexdigest()}.json").write_text(
        json.dumps(
            {
                "startUrl": SSO_START_URL,
                "region": REGION,
                "accessToken": SSO_ACCESS_TOKEN,
                "expiresAt": "2099-01-01T00:00:00Z",
            }
        )
    )
    # botocore's SSO token cache, ~/.aws/sso/cache, expanded when botocore is imported
    from botocore.credentials import SSOProvider

    monkeypatch.setattr(SSOProvider, "_SSO_TOKEN_CACHE_DIR", str(cache))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(config))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-credentials"))
    monkeypatch.setenv("AWS_ENDPOINT_URL_SSO", f"http://127.0.0.1:{server.server_address[1]}")
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    try:
        yield "sso-reader"
    finally:
        server.shutdown()


async def test_an_sso_profiles_access_token_never_reaches_a_log(
    sqs, harness, monkeypatch, caplog, sso_profile
):
    """
    Class 12. The stream's session asks the portal for the role's keys with the profile's cached
    access token, sent in the ``x-amz-sso_bearer_token`` header; botocore logs that request,
    header and all, at DEBUG. Nobody told the scrubber the token (the STS filter looks only for
    ``secretAccessKey``/``sessionToken``), so it reaches the triggerer log in clear: whoever
    reads it can get keys for every role the person may assume until the token expires.
    """
    connection = sqs.connection()
    del connection["login"], connection["password"]
    connection["extra"]["profile_name"] = sso_profile
    monkeypatch.setenv("AIRFLOW_CONN_AWS_SSO", json.dumps(connection))
    url = sqs.create_queue()
    sqs.send(url, [{"n": 1}])
    with caplog.at_level(logging.DEBUG):
        watcher = harness.add(SqsSharedStreamTrigger(url, aws_conn_id="aws_sso", wait_time_seconds=1))
        await watcher.wait_for_events(1, timeout=60)
    assert SSO_ACCESS_TOKEN in _SsoPortal.tokens, "the stream never asked the portal"
    assert SSO_ROLE_SECRET not in caplog.text
    assert SSO_ROLE_TOKEN not in caplog.text
    assert SSO_ACCESS_TOKEN not in caplog.text


async def test_the_pages_depth_read_as_a_role_logs_no_role_secret(sqs, proxy, monkeypatch, caplog):  # noqa: F811
    """
    Class 12. The Streams page reads a queue's depth as the connection's role
    (``sqs/operations.py``); it opens the client with ``on_secrets`` that drops what it is told
    and installs no scrubber, so the role's session token, sent in every signed request's
    ``X-Amz-Security-Token`` header, is logged by botocore at DEBUG in the api-server's log.
    """
    url = _role_queue(sqs)  # three messages, in the role's account
    conn_id = _role_connection(proxy, monkeypatch, "aws_depth_role")
    before = len(_assumed_roles())
    with caplog.at_level(logging.DEBUG):
        depth = await queue_depth(conn_id, url, REGION).read()
    assert depth["visible"] == 3
    assumed = _assumed_roles()[before:]
    assert assumed, "the depth read did not assume the role"
    assert SECRET_KEY not in caplog.text
    for role in assumed:
        assert role.secret_access_key not in caplog.text
        assert role.session_token not in caplog.text


OIDC_CLIENT_SECRET = "sso-oidc-client-secret-never-logged-0d3f"
OIDC_REFRESH_TOKEN = "sso-oidc-refresh-token-never-logged-91aa"
OIDC_NEW_TOKENS = ("sso-oidc-new-access-never-logged-6c21", "sso-oidc-id-token-never-logged-2f87")


class _SsoOidc(BaseHTTPRequestHandler):
    """SSO OIDC's ``CreateToken`` (``POST /token``), answered as the service documents it."""

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        access, id_token = OIDC_NEW_TOKENS
        body = json.dumps(
            {
                "accessToken": access,
                "expiresIn": 3600,
                "idToken": id_token,
                "refreshToken": "sso-oidc-next-refresh-never-logged-b7e0",
                "tokenType": "Bearer",
            }
        ).encode()
        _answer_json(self, body)

    def log_message(self, *args: Any) -> None:
        pass


def test_an_sso_session_refresh_logs_none_of_its_secrets(caplog):
    """
    Class 12. A profile of an ``sso-session`` refreshes its access token with SSO OIDC's
    ``CreateToken`` (botocore's ``SSOTokenProvider``, through the stream's session): botocore
    logs the request (client secret, refresh token) and the answer (new access, id and refresh
    tokens) at DEBUG, on the loggers the STS filter sits on.
    """
    from botocore import UNSIGNED
    from botocore.config import Config

    from airflow_shared_stream.sqs.credentials import _install_sts_filter

    server = HTTPServer(("127.0.0.1", 0), _SsoOidc)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        _install_sts_filter()
        client = boto3.client(
            "sso-oidc",
            endpoint_url=f"http://127.0.0.1:{server.server_address[1]}",
            region_name=REGION,
            config=Config(signature_version=UNSIGNED),
        )
        with caplog.at_level(logging.DEBUG):
            answer = client.create_token(
                clientId="client-id",
                clientSecret=OIDC_CLIENT_SECRET,
                grantType="refresh_token",
                refreshToken=OIDC_REFRESH_TOKEN,
            )
    finally:
        server.shutdown()
    assert answer["accessToken"] == OIDC_NEW_TOKENS[0]
    assert "CreateToken" in caplog.text
    for secret in (OIDC_CLIENT_SECRET, OIDC_REFRESH_TOKEN, *OIDC_NEW_TOKENS, "next-refresh-never"):
        assert secret not in caplog.text
