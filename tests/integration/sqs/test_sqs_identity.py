"""
The stream runs as the ``aws`` connection says: as its ``role_arn``, never as the keys that assume
it; as its ``profile_name``.

moto's server implements STS ``AssumeRole`` (a role ARN in another account switches the account
the returned keys act in), and a recording proxy in front of it reads which access key signed
each request off the wire.
"""

from __future__ import annotations

import datetime
import json
import logging
import os
import random
from collections.abc import Iterator
from typing import Any

import boto3
import pytest

from airflow_shared_stream.sqs.errors import SqsConfigurationError
from airflow_shared_stream.sqs.hook import QueueUrl, SqsSharedStreamHook
from airflow_shared_stream.sqs.trigger import SqsSharedStreamTrigger
from tests.integration.sqs.conftest import ACCESS_KEY, REGION, SECRET_KEY
from tests.support.request_log import RecordingProxy

pytestmark = pytest.mark.integration

ROLE_ACCOUNT = "210987654321"
ROLE_ARN = f"arn:aws:iam::{ROLE_ACCOUNT}:role/shared-stream-reader"
EXTERNAL_ID = "shared-stream-external-id"


@pytest.fixture
def proxy(sqs) -> Iterator[RecordingProxy]:
    with RecordingProxy("127.0.0.1", sqs.port) as recording:
        yield recording


def _role_connection(
    proxy: RecordingProxy, monkeypatch: pytest.MonkeyPatch, conn_id: str, **extra: Any
) -> str:
    connection = {
        "conn_type": "aws",
        "login": ACCESS_KEY,
        "password": SECRET_KEY,
        "extra": {
            "region_name": REGION,
            "endpoint_url": proxy.endpoint_url,
            "role_arn": ROLE_ARN,
            "assume_role_kwargs": {"ExternalId": EXTERNAL_ID},
            "service_config": {"sts": {"endpoint_url": proxy.endpoint_url}},
            **extra,
        },
    }
    monkeypatch.setenv(f"AIRFLOW_CONN_{conn_id.upper()}", json.dumps(connection))
    return conn_id


def _role_queue(sqs) -> str:
    """A queue in the role's account, created as the role (the connection's keys cannot see it)."""
    sts = boto3.client(
        "sts",
        endpoint_url=sqs.endpoint_url,
        region_name=REGION,
        aws_access_key_id=ACCESS_KEY,
        aws_secret_access_key=SECRET_KEY,
    )
    credentials = sts.assume_role(RoleArn=ROLE_ARN, RoleSessionName="test-setup")["Credentials"]
    client = boto3.client(
        "sqs",
        endpoint_url=sqs.endpoint_url,
        region_name=REGION,
        aws_access_key_id=credentials["AccessKeyId"],
        aws_secret_access_key=credentials["SecretAccessKey"],
        aws_session_token=credentials["SessionToken"],
    )
    url = client.create_queue(QueueName=f"role-{random.getrandbits(32):08x}")["QueueUrl"]
    client.send_message_batch(
        QueueUrl=url, Entries=[{"Id": str(i), "MessageBody": json.dumps({"n": i})} for i in range(3)]
    )
    return url


def _assumed_roles() -> list[Any]:
    """What moto's STS handed out for ``ROLE_ARN`` (the server runs in this process)."""
    from moto.sts.models import sts_backends

    return [role for role in sts_backends[ROLE_ACCOUNT]["aws"].assumed_roles if role.role_arn == ROLE_ARN]


async def test_role_arn_is_assumed_and_every_sqs_call_is_signed_as_the_role(
    sqs, proxy, harness, monkeypatch, caplog
):
    url = _role_queue(sqs)
    conn_id = _role_connection(proxy, monkeypatch, "aws_role")
    before = len(_assumed_roles())
    with caplog.at_level(logging.DEBUG):
        trigger = SqsSharedStreamTrigger(url, aws_conn_id=conn_id, wait_time_seconds=1)
        watcher = harness.add(trigger)
        await watcher.wait_for_events(3, timeout=60)
    assert SECRET_KEY not in json.dumps(trigger.serialize())
    signers = proxy.signers()
    assert signers[("AssumeRole", ACCESS_KEY)] >= 1, signers
    sqs_signers = {key for (operation, key) in signers if operation != "AssumeRole"}
    assumed = _assumed_roles()[before:]
    assert assumed, "no AssumeRole reached moto"
    assert sqs_signers <= {role.access_key_id for role in assumed}, signers
    assert assumed[0].session_name == "Airflow_aws_role"
    assert assumed[0].external_id == EXTERNAL_ID
    # Neither the connection's secret nor the role's reaches a log line, botocore's DEBUG included.
    for role in assumed:
        assert role.secret_access_key not in caplog.text
        assert role.session_token not in caplog.text
    assert SECRET_KEY not in caplog.text


class _Clock:
    """
    The time as the role's credentials and moto's STS see it, moved forward to simulate idle days.

    moto never expires a token itself; its STS stamps ``Expiration`` from this clock too, so
    keys issued after the jump are valid in the jumped frame, as real ones would be.
    """

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        import moto.sts.models
        from moto.core.utils import utcnow

        self.offset = datetime.timedelta()
        monkeypatch.setattr(moto.sts.models, "utcnow", lambda: utcnow() + self.offset)

    def __call__(self) -> datetime.datetime:
        return datetime.datetime.now(datetime.UTC) + self.offset


async def test_the_role_is_assumed_again_before_its_keys_expire_on_a_stream_idle_for_days(
    sqs, proxy, monkeypatch
):
    from aiobotocore.config import AioConfig

    from airflow_shared_stream.sqs.credentials import open_sqs_client

    url = _role_queue(sqs)
    conn_id = _role_connection(proxy, monkeypatch, "aws_role_idle")
    hook = SqsSharedStreamHook(conn_id)
    config = await hook.aget_client_config(region_name=None, queue=QueueUrl.parse(url))
    clock = _Clock(monkeypatch)
    seen: list[str] = []
    async with open_sqs_client(config, AioConfig(), on_secrets=seen.extend, clock=clock) as client:
        await client.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])
        first = {key for (operation, key) in proxy.signers() if operation == "GetQueueAttributes"}
        for days in (1, 3):  # idle, then idle again: each time a fresh role session, no failure
            proxy.reset()
            clock.offset += datetime.timedelta(days=days)
            await client.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])
            signers = proxy.signers()
            assert signers[("AssumeRole", ACCESS_KEY)] == 1, signers
            again = {key for (operation, key) in signers if operation == "GetQueueAttributes"}
            assert again, signers
            assert again.isdisjoint(first), signers
            first = again
        proxy.reset()
        await client.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])
        assert proxy.signers()[("AssumeRole", ACCESS_KEY)] == 0, "fresh keys are reused until near expiry"
    # Every role secret handed out was given to the scrubber.
    assert {role.secret_access_key for role in _assumed_roles()[-3:]} <= set(seen)


PROFILE_KEY = "AKIDPROFILESTREAM"
PROFILE_SECRET = "profile-secret-never-logged-3c9a"


@pytest.fixture
def shared_credentials(tmp_path, monkeypatch) -> str:
    """A shared credentials file on the triggerer with one profile, and no keys in the environment."""
    path = tmp_path / "credentials"
    path.write_text(f"[team]\naws_access_key_id = {PROFILE_KEY}\naws_secret_access_key = {PROFILE_SECRET}\n")
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(path))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-config"))
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    return "team"


async def test_profile_name_signs_as_the_profile_and_assumes_the_role_with_it(
    sqs, proxy, harness, monkeypatch, shared_credentials
):
    url = _role_queue(sqs)
    conn_id = _role_connection(proxy, monkeypatch, "aws_profile_role", profile_name=shared_credentials)
    connection = json.loads(os.environ["AIRFLOW_CONN_AWS_PROFILE_ROLE"])
    del connection["login"], connection["password"]
    monkeypatch.setenv("AIRFLOW_CONN_AWS_PROFILE_ROLE", json.dumps(connection))
    watcher = harness.add(SqsSharedStreamTrigger(url, aws_conn_id=conn_id, wait_time_seconds=1))
    await watcher.wait_for_events(3, timeout=60)
    signers = proxy.signers()
    assert signers[("AssumeRole", PROFILE_KEY)] >= 1, signers
    assert not any(
        key in (PROFILE_KEY, ACCESS_KEY) for (operation, key) in signers if operation != "AssumeRole"
    )


async def test_profile_name_without_a_role_signs_every_sqs_call_as_the_profile(
    sqs, proxy, harness, monkeypatch, shared_credentials
):
    connection = sqs.connection()
    del connection["login"], connection["password"]
    connection["extra"].update(endpoint_url=proxy.endpoint_url, profile_name=shared_credentials)
    monkeypatch.setenv("AIRFLOW_CONN_AWS_PROFILE", json.dumps(connection))
    url = sqs.create_queue()
    sqs.send(url, [{"n": 1}])
    watcher = harness.add(SqsSharedStreamTrigger(url, aws_conn_id="aws_profile", wait_time_seconds=1))
    await watcher.wait_for_events(1, timeout=60)
    assert {key for (_operation, key) in proxy.signers()} == {PROFILE_KEY}, proxy.signers()


async def test_a_profile_the_triggerer_does_not_have_is_named(sqs, harness, monkeypatch, shared_credentials):
    connection = sqs.connection()
    del connection["login"], connection["password"]
    connection["extra"]["profile_name"] = "nobody"
    monkeypatch.setenv("AIRFLOW_CONN_AWS_NO_PROFILE", json.dumps(connection))
    watcher = harness.add(SqsSharedStreamTrigger(sqs.create_queue(), aws_conn_id="aws_no_profile"))
    error = await watcher.wait_for_error()
    assert isinstance(error, SqsConfigurationError)
    assert "profile_name 'nobody' is not in" in str(error)
