"""
Airflow Connection -> aiobotocore SQS client settings.

Reads the ``aws`` connection as ``apache-airflow-providers-amazon`` does, so existing
``aws_default`` connections work unchanged: ``login`` is the access key id, ``password`` the
secret access key (or ``extra.aws_access_key_id`` and ``extra.aws_secret_access_key``), and
``extra`` may hold ``region_name``, ``endpoint_url`` (or ``service_config.sqs.endpoint_url``),
``aws_session_token``, ``profile_name``, ``role_arn`` with ``assume_role_kwargs``, ``verify``
and some ``config_kwargs``. A connection without keys falls back to botocore's default
credential chain (environment, shared config, instance or task role), as the Amazon provider
does. Any other setting is refused (:mod:`airflow_shared_stream.sqs.credentials`): it could
change who the stream runs as.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from airflow.sdk import BaseHook
from airflow.sdk.exceptions import AirflowNotFoundException

from airflow_shared_stream.common.errors import SecretScrubber
from airflow_shared_stream.common.renamed import renamed_names
from airflow_shared_stream.sqs.credentials import (
    SqsClientConfig,
    open_sqs_client,
    refused_extras,
    sdk_logger_names,
)
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


class SqsSharedStreamHook(BaseHook):
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

    async def aget_client_config(self, *, region_name: str | None, queue: QueueUrl) -> SqsClientConfig:
        """Read the connection (through the triggerer's secrets backends) and build the config."""
        try:
            conn = await BaseHook.aget_connection(self.aws_conn_id)
        except AirflowNotFoundException:
            raise SqsConfigurationError(f"Airflow connection {self.aws_conn_id!r} is not defined") from None
        extra = conn.extra_dejson or {}
        refused = [
            f"{name} (use extra.endpoint_url)" for name in ("host", "port") if getattr(conn, name, None)
        ]
        refused.extend(refused_extras(extra))
        if refused:
            raise SqsConfigurationError(
                f"connection {self.aws_conn_id!r} has settings the SQS shared stream does not support "
                f"(they could change who it runs as): {'; '.join(refused)}"
            )
        region = region_name or extra.get("region_name") or queue.region_in_host
        if not region:
            raise SqsConfigurationError(
                f"no AWS region for queue {queue.url!r}: pass region_name to the trigger or set "
                f"extra.region_name on connection {self.aws_conn_id!r}"
            )
        service_config = extra.get("service_config") or {}
        endpoint = (service_config.get("sqs") or {}).get("endpoint_url") or extra.get("endpoint_url")
        access_key, secret_key = self._keys(conn.login, conn.password, extra)
        if extra.get("aws_session_token") and not access_key:
            raise SqsConfigurationError(
                f"connection {self.aws_conn_id!r} sets aws_session_token without the access key it "
                "belongs to: set login and password too"
            )
        return SqsClientConfig(
            region_name=region,
            endpoint_url=endpoint,
            aws_access_key_id=access_key,
            aws_secret_access_key=secret_key,
            aws_session_token=extra.get("aws_session_token"),
            conn_id=self.aws_conn_id,
            profile_name=extra.get("profile_name"),
            role_arn=extra.get("role_arn"),
            assume_role_kwargs=dict(extra.get("assume_role_kwargs") or {}),
            sts_endpoint_url=(service_config.get("sts") or {}).get("endpoint_url"),
            verify=extra.get("verify"),
            config_kwargs=dict(extra.get("config_kwargs") or {}),
        )

    def _keys(
        self, login: str | None, password: str | None, extra: dict[str, Any]
    ) -> tuple[str | None, str | None]:
        """The access key pair: login and password, or the extra's pair; never half of one, never both."""
        pairs = [
            (where, key, secret)
            for where, key, secret in (
                ("login and password", login, password),
                (
                    "extra.aws_access_key_id and extra.aws_secret_access_key",
                    extra.get("aws_access_key_id"),
                    extra.get("aws_secret_access_key"),
                ),
            )
            if key or secret
        ]
        for where, key, secret in pairs:
            if not (key and secret):
                raise SqsConfigurationError(
                    f"connection {self.aws_conn_id!r} sets only one of {where} (access key id and "
                    "secret access key); set both, or neither to use the default credential chain"
                )
        if len(pairs) > 1:
            raise SqsConfigurationError(
                f"connection {self.aws_conn_id!r} sets an access key both in login and password and "
                "in extra: set it in one place"
            )
        return (pairs[0][1], pairs[0][2]) if pairs else (None, None)


@contextlib.asynccontextmanager
async def open_queue_client(
    *,
    aws_conn_id: str,
    region_name: str | None,
    queue: QueueUrl,
    wait_seconds: int,
    scrubber: SecretScrubber,
) -> AsyncIterator[Any]:
    """
    The SQS client of a stream or a redrive: the connection's identity, and botocore's loggers scrubbed.

    Its read timeout outlasts a ``wait_seconds`` long poll. botocore logs signed requests at
    DEBUG, session token header included, so ``scrubber`` learns every secret the client sends
    and sits on each SDK logger once the client (and so its modules' loggers) exists.
    """
    from aiobotocore.config import AioConfig

    config = await SqsSharedStreamHook(aws_conn_id).aget_client_config(region_name=region_name, queue=queue)
    client_config = AioConfig(
        connect_timeout=10,
        read_timeout=wait_seconds + 15,
        retries={"mode": "standard", "max_attempts": 5},
    )
    async with open_sqs_client(
        config, client_config, on_secrets=lambda secrets: scrubber.add(*secrets)
    ) as client:
        scrubber.install(*sdk_logger_names())
        yield client


__getattr__ = renamed_names(__name__, globals(), {"SqsHook": "SqsSharedStreamHook"})
