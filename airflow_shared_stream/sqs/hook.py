"""
Airflow Connection -> aiobotocore SQS client settings.

Reads the ``aws`` connection exactly as ``apache-airflow-providers-amazon`` does, so existing
``aws_default`` connections work unchanged: ``login`` is the access key id, ``password`` the
secret access key, and ``extra`` may hold ``region_name``, ``endpoint_url`` (or
``service_config.sqs.endpoint_url``) and ``aws_session_token``. A connection without keys
falls back to botocore's default credential chain (environment, shared config, instance or
task role), as the Amazon provider does.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from airflow.sdk import BaseHook
from airflow.sdk.exceptions import AirflowNotFoundException

from airflow_shared_stream.sqs.errors import SqsConfigurationError

_REGION = r"(?P<region>[a-z]{2}(?:-[a-z]+)+-\d+)"
_AWS_QUEUE_HOSTS = tuple(
    re.compile(f"^{pattern}$")
    for pattern in (
        # sqs.<region>.amazonaws.com[.cn], sqs-fips.<region>..., <region>.queue.amazonaws.com[.cn]
        rf"(?:sqs(?:-fips)?\.)?{_REGION}\.(?:queue\.)?amazonaws\.com(?:\.cn)?",
        rf"sqs\.{_REGION}\.api\.aws",  # dual-stack
        rf"vpce-[a-z0-9-]+\.sqs\.{_REGION}\.vpce\.amazonaws\.com(?:\.cn)?",  # interface endpoints
    )
)
"""Every host AWS routes to the regional SQS service: all of them name the same queues."""
_LEGACY_US_EAST_1_HOST = "queue.amazonaws.com"
"""The legacy global SQS host: queues of us-east-1."""
_QUEUE_PATH = re.compile(r"^/(?P<account>\d{12})/(?P<name>[A-Za-z0-9_-]{1,80}(?:\.fifo)?)$")


@dataclass(frozen=True)
class QueueUrl:
    """A validated SQS queue URL."""

    url: str
    account: str
    name: str
    region_in_host: str | None
    endpoint: str = ""
    """Where the URL points, normalised: ``aws:<region>`` for AWS hosts, else ``host:port``."""

    @property
    def is_fifo(self) -> bool:
        return self.name.endswith(".fifo")

    @property
    def identity(self) -> tuple[str, str, str]:
        """
        The queue itself, whatever the spelling of its URL: the stream key of the SQS stream.

        ``https://sqs.us-east-1.amazonaws.com/1/q``, ``https://us-east-1.queue.amazonaws.com/1/q``
        and ``HTTPS://SQS.us-east-1.amazonaws.com/1/q/`` are one queue; a local endpoint is
        identified by its host and port.
        """
        return (self.endpoint, self.account, self.name)

    @classmethod
    def parse(cls, url: str) -> QueueUrl:
        """
        Check that ``url`` has the shape of an SQS queue URL (``scheme://host/<account>/<name>``).

        Any host is accepted, so VPC endpoints and local SQS implementations work; the path
        must be an SQS account id and queue name.
        """
        if not isinstance(url, str):
            raise SqsConfigurationError(f"queue_url must be a string, got {type(url).__name__}")
        parts = urlsplit(url.strip())
        path = _QUEUE_PATH.match((parts.path or "").rstrip("/") or "/")
        if parts.scheme.lower() not in ("http", "https") or not parts.hostname or path is None:
            raise SqsConfigurationError(
                f"{url!r} is not an SQS queue URL: expected "
                "https://sqs.<region>.amazonaws.com/<12-digit account id>/<queue name>"
            )
        hostname = parts.hostname.lower().rstrip(".")
        region = _aws_region_of_host(hostname)
        if region is not None:
            endpoint = f"aws:{region}"
        else:
            default_port = 443 if parts.scheme.lower() == "https" else 80
            endpoint = f"{hostname}:{parts.port or default_port}"
        return cls(
            url=url,
            account=path["account"],
            name=path["name"],
            region_in_host=region,
            endpoint=endpoint,
        )


def _aws_region_of_host(hostname: str) -> str | None:
    """The region of an AWS SQS host (any of its spellings), ``None`` for any other host."""
    if hostname == _LEGACY_US_EAST_1_HOST:
        return "us-east-1"
    for pattern in _AWS_QUEUE_HOSTS:
        host = pattern.match(hostname)
        if host is not None:
            return host["region"]
    return None


@dataclass(frozen=True)
class SqsClientConfig:
    """Keyword arguments for ``AioSession.create_client("sqs", ...)``; secrets kept out of repr."""

    region_name: str
    endpoint_url: str | None = None
    aws_access_key_id: str | None = None
    aws_secret_access_key: str | None = field(default=None, repr=False)
    aws_session_token: str | None = field(default=None, repr=False)

    def client_kwargs(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if v is not None}


class SqsHook(BaseHook):
    """
    Resolve an ``aws`` Airflow Connection into SQS client settings for the shared stream.

    :param aws_conn_id: the Airflow connection to read (``aws_default`` by default).
    """

    conn_name_attr = "aws_conn_id"
    default_conn_name = "aws_default"
    conn_type = "aws"
    hook_name = "Amazon Web Services (shared stream)"

    def __init__(self, aws_conn_id: str = default_conn_name) -> None:
        super().__init__()
        self.aws_conn_id = aws_conn_id

    @classmethod
    def get_ui_field_behaviour(cls) -> dict[str, Any]:
        return {
            "hidden_fields": ["host", "schema", "port"],
            "relabeling": {"login": "AWS Access Key ID", "password": "AWS Secret Access Key"},
            "placeholders": {
                "extra": '{"region_name": "eu-west-1", "endpoint_url": "https://sqs.eu-west-1.amazonaws.com"}'
            },
        }

    async def aget_client_config(self, *, region_name: str | None, queue: QueueUrl) -> SqsClientConfig:
        """Read the connection (through the triggerer's secrets backends) and build the config."""
        try:
            conn = await BaseHook.aget_connection(self.aws_conn_id)
        except AirflowNotFoundException:
            raise SqsConfigurationError(f"Airflow connection {self.aws_conn_id!r} is not defined") from None
        extra = conn.extra_dejson or {}
        region = region_name or extra.get("region_name") or queue.region_in_host
        if not region:
            raise SqsConfigurationError(
                f"no AWS region for queue {queue.url!r}: pass region_name to the trigger or set "
                f"extra.region_name on connection {self.aws_conn_id!r}"
            )
        endpoint = extra.get("endpoint_url") or (
            (extra.get("service_config") or {}).get("sqs", {}).get("endpoint_url")
        )
        if bool(conn.login) != bool(conn.password):
            raise SqsConfigurationError(
                f"connection {self.aws_conn_id!r} sets only one of login (access key id) and "
                "password (secret access key); set both, or neither to use the default credential chain"
            )
        return SqsClientConfig(
            region_name=region,
            endpoint_url=endpoint,
            aws_access_key_id=conn.login or None,
            aws_secret_access_key=conn.password or None,
            aws_session_token=extra.get("aws_session_token"),
        )
