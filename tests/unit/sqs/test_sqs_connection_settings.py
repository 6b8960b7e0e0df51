"""Every ``aws`` connection setting is either read or refused by name: none is dropped silently."""

from __future__ import annotations

import json
import logging

import pytest

from airflow_shared_stream.sqs.credentials import _StsSecretFilter, role_session_name
from airflow_shared_stream.sqs.errors import SqsConfigurationError
from airflow_shared_stream.sqs.hook import QueueUrl, SqsSharedStreamHook

QUEUE = QueueUrl.parse("https://sqs.eu-west-1.amazonaws.com/123456789012/orders")
SECRET = "wJalrXUtnFEMI-never-in-an-error"
ROLE = "arn:aws:iam::123456789012:role/reader"


def _set_conn(monkeypatch, conn_id: str, **conn):
    monkeypatch.setenv(f"AIRFLOW_CONN_{conn_id.upper()}", json.dumps({"conn_type": "aws", **conn}))


async def _config(monkeypatch, **conn):
    _set_conn(monkeypatch, "aws_settings", login="AKID", password=SECRET, **conn)
    return await SqsSharedStreamHook("aws_settings").aget_client_config(region_name=None, queue=QUEUE)


@pytest.mark.parametrize(
    ("extra", "named"),
    [
        (
            {"role_arn": ROLE, "assume_role_method": "assume_role_with_saml"},
            "assume_role_method='assume_role_with_saml'",
        ),
        (
            {"role_arn": ROLE, "assume_role_method": "assume_role_with_web_identity"},
            "assume_role_method='assume_role_with_web_identity'",
        ),
        ({"role_arn": ROLE, "assume_role_with_saml": {"principal_arn": "x"}}, "assume_role_with_saml (SAML"),
        ({"assume_role_with_web_identity_token_file": "/t"}, "assume_role_with_web_identity_token_file (web"),
        ({"assume_role_kwargs": {"ExternalId": "x"}}, "assume_role_kwargs (needs role_arn)"),
        ({"assume_role_method": "assume_role"}, "assume_role_method (needs role_arn)"),
        ({"role_arn": ROLE, "assume_role_kwargs": {"TokenCode": "123456"}}, "assume_role_kwargs.TokenCode"),
        ({"role_arn": ROLE, "assume_role_kwargs": {"RoleArn": "arn:other"}}, "assume_role_kwargs.RoleArn"),
        ({"session_kwargs": {"profile_name": "p"}}, "session_kwargs (deprecated"),
        (
            {"aws_iam_role": "r", "aws_account_id": "1"},
            "aws_account_id (use role_arn); aws_iam_role (use role_arn)",
        ),
        ({"s3_config_file": "/creds"}, "s3_config_file"),
        ({"Role_Arn": ROLE}, "Role_Arn (unknown)"),
        ({"config_kwargs": {"signature_version": "unsigned"}}, "config_kwargs.signature_version"),
        ({"config_kwargs": {"retries": {"max_attempts": 1}}}, "config_kwargs.retries"),
        ({"service_config": {"sqs": {"region_name": "x"}}}, "service_config.sqs.region_name"),
        ({"service_config": {"sts": {"region_name": "x"}}}, "service_config.sts.region_name"),
    ],
)
async def test_an_unsupported_setting_is_refused_by_name(monkeypatch, extra, named):
    with pytest.raises(SqsConfigurationError, match="does not support") as exc_info:
        await _config(monkeypatch, extra={"region_name": "eu-west-1", **extra})
    message = str(exc_info.value)
    assert named in message
    assert "'aws_settings'" in message
    assert SECRET not in message


async def test_a_host_on_the_connection_is_refused(monkeypatch):
    with pytest.raises(SqsConfigurationError, match=r"host \(use extra.endpoint_url\)"):
        await _config(monkeypatch, host="localhost", port=4566)


async def test_the_supported_settings_are_all_read(monkeypatch):
    config = await _config(
        monkeypatch,
        extra={
            "region_name": "eu-west-2",
            "endpoint_url": "http://everything:1",
            "role_arn": ROLE,
            "assume_role_method": "assume_role",
            "assume_role_kwargs": {"ExternalId": "ext", "DurationSeconds": 900},
            "profile_name": "team",
            "verify": "/etc/ca.pem",
            "config_kwargs": {"proxies": {"https": "http://proxy:3128"}},
            "service_config": {
                "sqs": {"endpoint_url": "http://sqs:2"},
                "sts": {"endpoint_url": "http://sts:3"},
                "s3": {"bucket_name": "belongs-to-another-hook"},
            },
        },
    )
    assert config.role_arn == ROLE
    assert config.assume_role_kwargs == {"ExternalId": "ext", "DurationSeconds": 900}
    assert config.profile_name == "team"
    assert config.sts_endpoint_url == "http://sts:3"
    assert config.config_kwargs == {"proxies": {"https": "http://proxy:3128"}}
    # With a role the keys only call STS: SQS gets none of them.
    assert config.client_kwargs(with_keys=False) == {
        "region_name": "eu-west-2",
        "endpoint_url": "http://sqs:2",
        "verify": "/etc/ca.pem",
    }
    assert SECRET not in repr(config)
    assert "ext" not in repr(config)


async def test_keys_may_be_in_the_extra_but_not_in_two_places(monkeypatch):
    _set_conn(
        monkeypatch,
        "aws_extra_keys",
        extra={"region_name": "eu-west-1", "aws_access_key_id": "AKX", "aws_secret_access_key": SECRET},
    )
    config = await SqsSharedStreamHook("aws_extra_keys").aget_client_config(region_name=None, queue=QUEUE)
    assert (config.aws_access_key_id, config.aws_secret_access_key) == ("AKX", SECRET)
    with pytest.raises(SqsConfigurationError, match="set it in one place") as exc_info:
        await _config(monkeypatch, extra={"aws_access_key_id": "AKX", "aws_secret_access_key": SECRET})
    assert SECRET not in str(exc_info.value)
    _set_conn(monkeypatch, "aws_half_extra", extra={"aws_access_key_id": "AKX"})
    with pytest.raises(SqsConfigurationError, match=r"only one of extra\.aws_access_key_id"):
        await SqsSharedStreamHook("aws_half_extra").aget_client_config(region_name=None, queue=QUEUE)


async def test_a_session_token_without_its_key_is_refused(monkeypatch):
    _set_conn(monkeypatch, "aws_token_only", extra={"region_name": "eu-west-1", "aws_session_token": SECRET})
    with pytest.raises(SqsConfigurationError, match="without the access key") as exc_info:
        await SqsSharedStreamHook("aws_token_only").aget_client_config(region_name=None, queue=QUEUE)
    assert SECRET not in str(exc_info.value)


async def test_a_proxy_password_goes_to_the_scrubber(monkeypatch):
    from aiobotocore.config import AioConfig

    from airflow_shared_stream.sqs.credentials import open_sqs_client

    config = await _config(
        monkeypatch,
        extra={
            "region_name": "eu-west-1",
            "config_kwargs": {"proxies": {"https": "http://u:proxy-pw@p:3128"}},
        },
    )
    seen: list[str] = []
    async with open_sqs_client(config, AioConfig(), on_secrets=seen.extend) as client:
        assert client.meta.config.proxies == {"https": "http://u:proxy-pw@p:3128"}
    assert set(seen) == {SECRET, "proxy-pw"}


def test_the_session_name_is_the_amazon_providers_in_the_alphabet_sts_accepts():
    assert role_session_name("aws default/1") == "Airflow_awsdefault1"
    assert len(role_session_name("x" * 100)) == 64


def test_sts_responses_are_redacted_in_log_records():
    body = (
        "<AssumeRoleResult><Credentials><AccessKeyId>ASIAX</AccessKeyId>"
        f"<SecretAccessKey>{SECRET}</SecretAccessKey><SessionToken>tok+/=</SessionToken>"
        "</Credentials></AssumeRoleResult>"
    )
    record = logging.LogRecord(
        "botocore.parsers", logging.DEBUG, __file__, 1, "Response body:\n%s", (body,), None
    )
    assert _StsSecretFilter().filter(record)
    text = record.getMessage()
    assert SECRET not in text
    assert "tok+/=" not in text
    assert "<AccessKeyId>ASIAX</AccessKeyId>" in text
    as_json = json.dumps({"Credentials": {"SecretAccessKey": SECRET, "SessionToken": "tok"}})
    record = logging.LogRecord("botocore.parsers", logging.DEBUG, __file__, 1, as_json, None, None)
    _StsSecretFilter().filter(record)
    assert SECRET not in record.getMessage()


def test_sso_role_credentials_are_redacted_in_log_records():
    """A profile signed in with IAM Identity Center: GetRoleCredentials answers in camelCase."""
    answer = {
        "roleCredentials": {"accessKeyId": "ASIAX", "secretAccessKey": SECRET, "sessionToken": "tok+/="}
    }
    record = logging.LogRecord(
        "botocore.parsers",
        logging.DEBUG,
        __file__,
        1,
        "Response body:\n%r",
        (json.dumps(answer).encode(),),
        None,
    )
    assert _StsSecretFilter().filter(record)
    text = record.getMessage()
    assert SECRET not in text
    assert "tok+/=" not in text
    assert '"accessKeyId": "ASIAX"' in text
