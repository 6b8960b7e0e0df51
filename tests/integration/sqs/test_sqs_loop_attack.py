"""
Attacks on issue 50's off-loop SQS client (``build_client_off_loop``), against moto's SQS and STS.

FAULT_MODEL class 13 (a trigger never blocks the triggerer's loop) and class 16 (the real AWS
credential chain, not only the connection's own extras).
"""

from __future__ import annotations

import json

import pytest

from airflow_shared_stream.sqs.hook import QueueUrl, SqsSharedStreamHook
from tests.integration.sqs.conftest import ACCESS_KEY, REGION, SECRET_KEY
from tests.integration.sqs.test_sqs_client_off_loop import built_on_this_thread
from tests.integration.sqs.test_sqs_identity import EXTERNAL_ID, ROLE_ARN, _role_queue, proxy  # noqa: F401

pytestmark = pytest.mark.integration


@pytest.fixture
def profile_role(tmp_path, monkeypatch, proxy) -> str:  # noqa: F811
    """
    A profile of the triggerer's shared AWS config that is itself a role (``role_arn`` +
    ``source_profile``), the way AWS documents assuming a role from the CLI's config; its STS is
    moto, behind the recording proxy (``AWS_ENDPOINT_URL_STS``, botocore's service endpoint setting).
    """
    (tmp_path / "credentials").write_text(
        f"[source]\naws_access_key_id = {ACCESS_KEY}\naws_secret_access_key = {SECRET_KEY}\n"
    )
    (tmp_path / "config").write_text(
        f"[profile reader]\nrole_arn = {ROLE_ARN}\nsource_profile = source\n"
        f"external_id = {EXTERNAL_ID}\nregion = {REGION}\n"
    )
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "credentials"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "config"))
    monkeypatch.setenv("AWS_ENDPOINT_URL_STS", proxy.endpoint_url)
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    connection = {
        "conn_type": "aws",
        "extra": {"region_name": REGION, "endpoint_url": proxy.endpoint_url, "profile_name": "reader"},
    }
    monkeypatch.setenv("AIRFLOW_CONN_AWS_PROFILE_READER", json.dumps(connection))
    return "aws_profile_reader"


async def test_a_profile_roles_sts_client_is_built_off_the_event_loop(sqs, proxy, profile_role) -> None:  # noqa: F811
    """
    Class 13. Issue 50's change built "the STS client when a role is assumed" off the loop, but only
    for the connection's ``role_arn``. A ``profile_name`` whose profile is a role (``role_arn`` and
    ``source_profile`` in the shared config, which ``_session`` reads through botocore's own chain)
    is assumed by aiobotocore's ``AssumeRoleProvider``: ``build_client_off_loop`` looks its
    credentials up on the loop (deferred), and the first signed request refreshes them there,
    building an STS client on the triggerer's loop (and again at every refresh, hourly). Fixed:
    ``_session`` gives the session a ``create_client`` that builds through ``build_client_off_loop``.
    """
    from aiobotocore.config import AioConfig

    from airflow_shared_stream.sqs.credentials import open_sqs_client

    url = _role_queue(sqs)
    config = await SqsSharedStreamHook(profile_role).aget_client_config(
        region_name=None, queue=QueueUrl.parse(url)
    )
    with built_on_this_thread() as seen:
        async with open_sqs_client(config, AioConfig(), on_secrets=lambda _secrets: None) as client:
            await client.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])
    assert proxy.signers()[("AssumeRole", ACCESS_KEY)] == 1, proxy.signers()
    assert seen == [], f"built on the event loop's thread: {seen}"
