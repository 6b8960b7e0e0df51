"""
Who the SQS client runs as: the ``aws`` connection's extras checked, then an aiobotocore client.

The extras are the Amazon provider's (``AwsConnectionWrapper``). The ones that choose the
identity or the endpoint are read; every other one is refused with an error naming it, because
a setting dropped on the floor can make the stream run as the triggerer's own identity.
``role_arn`` is assumed through STS ``AssumeRole`` with refreshable credentials, so a stream
idle for days assumes the role again instead of failing on an expired token.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from airflow_shared_stream.common.off_loop import run_off_loop
from airflow_shared_stream.sqs.errors import SqsAccessError, SqsConfigurationError, SqsEndpointError

if TYPE_CHECKING:
    import datetime

    from aiobotocore.client import AioBaseClient
    from aiobotocore.config import AioConfig
    from aiobotocore.session import AioSession


@dataclass(frozen=True)
class SqsClientConfig:
    """
    Who the SQS client runs as and where it connects; secrets kept out of repr.

    ``role_arn`` set: the keys (or the profile, or the default chain) only call STS
    ``AssumeRole``, and SQS is called as the role
    (:func:`~airflow_shared_stream.sqs.credentials.open_sqs_client`).
    """

    region_name: str
    endpoint_url: str | None = None
    aws_access_key_id: str | None = None
    aws_secret_access_key: str | None = field(default=None, repr=False)
    aws_session_token: str | None = field(default=None, repr=False)
    conn_id: str = "aws_default"
    profile_name: str | None = None
    role_arn: str | None = None
    assume_role_kwargs: dict[str, Any] = field(default_factory=dict, repr=False)
    sts_endpoint_url: str | None = None
    verify: bool | str | None = None
    config_kwargs: dict[str, Any] = field(default_factory=dict, repr=False)

    def client_kwargs(self, *, with_keys: bool = True) -> dict[str, Any]:
        """Keyword arguments for ``create_client("sqs", ...)`` (the keys only without a role)."""
        kwargs: dict[str, Any] = {
            "region_name": self.region_name,
            "endpoint_url": self.endpoint_url,
            "verify": self.verify,
        }
        if with_keys:
            kwargs["aws_access_key_id"] = self.aws_access_key_id
            kwargs["aws_secret_access_key"] = self.aws_secret_access_key
            kwargs["aws_session_token"] = self.aws_session_token
        return {k: v for k, v in kwargs.items() if v is not None}


READ_EXTRAS = frozenset(
    {
        "region_name",
        "endpoint_url",
        "service_config",
        "aws_access_key_id",
        "aws_secret_access_key",
        "aws_session_token",
        "profile_name",
        "role_arn",
        "assume_role_method",
        "assume_role_kwargs",
        "verify",
        "config_kwargs",
    }
)
"""Connection extras the SQS stream reads; any other extra is refused."""

REFUSED_EXTRAS: Mapping[str, str] = {
    "assume_role_with_saml": "SAML federation is not supported",
    "assume_role_with_web_identity_federation": "web identity federation is not supported",
    "assume_role_with_web_identity_token_file": "web identity federation is not supported",
    "assume_role_with_web_identity_federation_audience": "web identity federation is not supported",
    "session_kwargs": "deprecated by the Amazon provider: use login, password and profile_name",
    "s3_config_file": "credential files are read only through profile_name",
    "s3_config_format": "credential files are read only through profile_name",
    "profile": "use profile_name",
    "aws_account_id": "use role_arn",
    "aws_iam_role": "use role_arn",
    "external_id": "use assume_role_kwargs.ExternalId",
    "host": "use endpoint_url",
}
"""Extras some version of the Amazon provider knew, with what to use instead."""

ASSUME_ROLE_KWARGS = frozenset(
    {
        "RoleSessionName",
        "DurationSeconds",
        "ExternalId",
        "Policy",
        "PolicyArns",
        "Tags",
        "TransitiveTagKeys",
        "SourceIdentity",
        "ProvidedContexts",
    }
)
"""``AssumeRole`` parameters ``assume_role_kwargs`` may set. Not ``SerialNumber``/``TokenCode``:
a one-time MFA code cannot assume the role again when its keys expire."""

CONFIG_KWARGS = frozenset({"proxies", "proxies_config", "user_agent_extra", "user_agent_appid"})
"""botocore ``Config`` settings ``config_kwargs`` may set; the stream sets timeouts and retries."""

SERVICE_CONFIG_KEYS: Mapping[str, frozenset[str]] = {
    "sqs": frozenset({"endpoint_url"}),
    "sts": frozenset({"endpoint_url", "test_endpoint_url"}),
}
"""``service_config`` keys read per service (``sts.test_endpoint_url`` is the UI's test button's).
Sections for other services belong to other hooks sharing the connection and are not read."""

_SESSION_NAME_INVALID = re.compile(r"[^\w+=,.@-]")
_STS_SECRET_FIELDS = re.compile(
    r"(<(SecretAccessKey|SessionToken)>)[^<]*(</\2>)"
    r"|(\"(SecretAccessKey|SessionToken|AccessToken|RefreshToken|ClientSecret|IdToken)\"\s*:\s*\")[^\"]*(\")"
    r"|('x-amz-sso_bearer_token'\s*:\s*b?')[^']*(')",
    # SSO's GetRoleCredentials answers secretAccessKey and sessionToken; it is asked with the
    # profile's cached access token in a header botocore logs with the request; SSO OIDC's
    # CreateToken (an sso-session's refresh) sends a client secret and a refresh token, and
    # answers new tokens.
    re.IGNORECASE,
)
_STS_SECRET_MARKERS = (
    "secretaccesskey",
    "sessiontoken",
    "x-amz-sso_bearer_token",
    '"accesstoken"',
    '"refreshtoken"',
    '"clientsecret"',
    '"idtoken"',
)
_RESPONSE_LOGGERS = ("botocore.parsers", "aiobotocore.parsers", "botocore.endpoint", "aiobotocore.endpoint")


SDK_LOGGERS = (
    "botocore.auth",
    "botocore.credentials",
    "botocore.endpoint",
    "botocore.hooks",
    "botocore.httpsession",
    "botocore.parsers",
    "botocore.retryhandler",
    "aiobotocore.credentials",
    "aiobotocore.endpoint",
    "aiobotocore.httpsession",
)
"""Loggers that show request headers or bodies (``botocore.auth`` logs the canonical request at
DEBUG, ``X-Amz-Security-Token`` included): the secret scrubber is attached to each."""


def sdk_logger_names() -> list[str]:
    """
    :data:`SDK_LOGGERS` and every botocore/aiobotocore logger that exists by now.

    A logger's filters do not apply to its children's records, so the scrubber must sit on
    each module's own logger; the client is built before this is called, so its modules'
    loggers exist.
    """
    existing = [
        name
        for name in list(logging.root.manager.loggerDict)
        if name.split(".", 1)[0] in ("botocore", "aiobotocore")
    ]
    return sorted({*SDK_LOGGERS, *existing})


def refused_extras(extra: Mapping[str, Any]) -> list[str]:
    """One line per extra (or nested key) of ``extra`` the SQS stream does not read."""
    problems = []
    for key in sorted(extra):
        if key in REFUSED_EXTRAS:
            problems.append(f"{key} ({REFUSED_EXTRAS[key]})")
        elif key not in READ_EXTRAS:
            problems.append(f"{key} (unknown)")
    method = extra.get("assume_role_method", "assume_role")
    if method != "assume_role":
        problems.append(f"assume_role_method={method!r} (only 'assume_role' is supported)")
    if not extra.get("role_arn"):
        problems.extend(
            f"{key} (needs role_arn)" for key in ("assume_role_method", "assume_role_kwargs") if key in extra
        )
    problems.extend(_unread_keys("assume_role_kwargs", extra.get("assume_role_kwargs"), ASSUME_ROLE_KWARGS))
    problems.extend(_unread_keys("config_kwargs", extra.get("config_kwargs"), CONFIG_KWARGS))
    service_config = extra.get("service_config") or {}
    if not isinstance(service_config, Mapping):
        problems.append("service_config (not an object)")
        service_config = {}
    for service, keys in SERVICE_CONFIG_KEYS.items():
        problems.extend(_unread_keys(f"service_config.{service}", service_config.get(service), keys))
    return problems


def _unread_keys(name: str, value: Any, allowed: Iterable[str]) -> list[str]:
    if value is None:
        return []
    if not isinstance(value, Mapping):
        return [f"{name} (not an object)"]
    return [f"{name}.{key} (not supported)" for key in sorted(value) if key not in allowed]


def role_session_name(conn_id: str) -> str:
    """The Amazon provider's default session name, ``Airflow_<conn_id>``, in STS's alphabet."""
    return _SESSION_NAME_INVALID.sub("", f"Airflow_{conn_id}")[:64]


class _StsSecretFilter(logging.Filter):
    """
    Redact the keys in STS (and SSO) responses, which botocore logs at DEBUG before anyone can
    know them, and the SSO access token botocore sends (and logs) to get them.

    The secret scrubber removes secrets it was told about; these are new on every refresh.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        folded = message.lower()
        if any(marker in folded for marker in _STS_SECRET_MARKERS):
            record.msg, record.args = _STS_SECRET_FIELDS.sub(_redact, message), None
        return True


def _redact(found: re.Match[str]) -> str:
    if found.group(1):
        return f"{found.group(1)}***{found.group(3)}"
    if found.group(4):
        return f"{found.group(4)}***{found.group(6)}"
    return f"{found.group(7)}***{found.group(8)}"


_STS_FILTER = _StsSecretFilter()


def _install_sts_filter() -> None:
    for name in _RESPONSE_LOGGERS:
        logger = logging.getLogger(name)
        if _STS_FILTER not in logger.filters:
            logger.addFilter(_STS_FILTER)


def _session(config: SqsClientConfig) -> AioSession:
    from aiobotocore.session import AioSession
    from botocore.exceptions import ProfileNotFound

    session = AioSession(profile=config.profile_name)
    # The session's own credential providers (a profile that is a role, or SSO) build their STS
    # or SSO clients through ``session.create_client`` when their credentials refresh, on the
    # runner's loop: built in a worker thread instead, like every other client of the stream.
    session.create_client = _off_loop_client_creator(session)
    if config.profile_name:
        try:
            session.get_scoped_config()
        except ProfileNotFound:
            raise SqsConfigurationError(
                f"connection {config.conn_id!r}: profile_name {config.profile_name!r} is not in the "
                "triggerer's shared AWS config or credentials files"
            ) from None
    return session


def _off_loop_client_creator(session: AioSession) -> Callable[..., Any]:
    """``session.create_client``, whose client is built by :func:`build_client_off_loop`."""

    @contextlib.asynccontextmanager
    async def create_client(service_name: str, **kwargs: Any) -> AsyncIterator[Any]:
        async with await build_client_off_loop(session, service_name, **kwargs) as client:
            yield client

    return create_client


def load_sqs_data(session: AioSession) -> None:
    """
    Read the botocore data files an SQS client is built from, into the session's loader cache.

    ``create_client`` reads them on first use (the endpoint table alone is over a megabyte of
    JSON): called in a worker thread first, the client is then built from the cache.
    """
    loader = session.get_component("data_loader")
    for name in ("endpoints", "partitions", "sdk-default-configuration", "_retry"):
        with contextlib.suppress(Exception):  # a botocore without the file builds without it
            loader.load_data(name)
    with contextlib.suppress(Exception):
        for model in ("service-2", "endpoint-rule-set-1", "paginators-1"):
            loader.load_service_model("sqs", model)
    with contextlib.suppress(Exception):
        session._get_internal_component("endpoint_resolver")


async def _source_credentials(config: SqsClientConfig, session: AioSession) -> Any:
    """The credentials that call STS: the connection's keys, else its profile or the default chain."""
    from aiobotocore.credentials import AioCredentials

    if config.aws_access_key_id and config.aws_secret_access_key:
        return AioCredentials(
            config.aws_access_key_id, config.aws_secret_access_key, config.aws_session_token
        )
    credentials = await session.get_credentials()
    if credentials is None:
        raise SqsConfigurationError(
            f"connection {config.conn_id!r} sets role_arn but has no credentials to assume it with: "
            "set login and password, profile_name, or give the triggerer default AWS credentials"
        )
    return credentials


def _assume_role(
    config: SqsClientConfig,
    session: AioSession,
    botocore_config: AioConfig,
    on_secrets: Callable[[Iterable[str]], None],
) -> Callable[[], Any]:
    """The refresh function of the role's credentials: one STS ``AssumeRole`` per call."""
    from botocore.exceptions import BotoCoreError, ClientError

    assert config.role_arn is not None
    role_arn = config.role_arn
    parameters = {
        "RoleSessionName": role_session_name(config.conn_id),
        **config.assume_role_kwargs,
        "RoleArn": role_arn,
    }

    async def refresh() -> dict[str, Any]:
        source = await (await _source_credentials(config, session)).get_frozen_credentials()
        try:
            async with await build_client_off_loop(
                session,
                "sts",
                region_name=config.region_name,
                endpoint_url=config.sts_endpoint_url,
                verify=config.verify,
                config=botocore_config,
                aws_access_key_id=source.access_key,
                aws_secret_access_key=source.secret_key,
                aws_session_token=source.token,
            ) as sts:
                response = await sts.assume_role(**parameters)
        except ClientError as exc:
            code = exc.response.get("Error", {}).get("Code", "Unknown")
            raise SqsAccessError(
                f"STS refused to let connection {config.conn_id!r} assume role {role_arn} ({code})"
            ) from None
        except BotoCoreError as exc:
            raise SqsEndpointError(
                f"STS AssumeRole of {role_arn} for connection {config.conn_id!r} failed "
                f"({type(exc).__name__})"
            ) from None
        credentials = response["Credentials"]
        on_secrets([credentials["SecretAccessKey"], credentials["SessionToken"]])
        return {
            "access_key": credentials["AccessKeyId"],
            "secret_key": credentials["SecretAccessKey"],
            "token": credentials["SessionToken"],
            "expiry_time": credentials["Expiration"].isoformat(),
        }

    return refresh


def _role_session(
    config: SqsClientConfig,
    botocore_config: AioConfig,
    on_secrets: Callable[[Iterable[str]], None],
    clock: Callable[[], datetime.datetime] | None,
) -> AioSession:
    """A session whose only credentials are the role's, refreshed before they expire."""
    from aiobotocore.credentials import AioCredentialResolver, AioDeferredRefreshableCredentials
    from botocore.credentials import CredentialProvider

    refresh = _assume_role(config, _session(config), botocore_config, on_secrets)
    options = {"time_fetcher": clock} if clock else {}
    credentials = AioDeferredRefreshableCredentials(
        refresh_using=refresh, method="sts-assume-role", **options
    )

    class RoleProvider(CredentialProvider):
        METHOD = "sts-assume-role"

        async def load(self) -> Any:
            return credentials

    session = _session(config)
    # The role alone: if assuming it fails, the client fails; it never falls back to the chain.
    session.register_component("credential_provider", AioCredentialResolver([RoleProvider()]))
    return session


@contextlib.asynccontextmanager
async def open_sqs_client(
    config: SqsClientConfig,
    botocore_config: AioConfig,
    *,
    on_secrets: Callable[[Iterable[str]], None],
    clock: Callable[[], datetime.datetime] | None = None,
) -> AsyncIterator[Any]:
    """
    An aiobotocore SQS client running as the connection says.

    ``on_secrets`` is given every secret the client will send (the connection's, and each role
    session's as it is assumed), for the scrubber. ``clock`` is the role credentials' notion of
    now (tests move it to simulate idle days).
    """
    on_secrets(
        [s for s in (config.aws_secret_access_key, config.aws_session_token, *_proxy_passwords(config)) if s]
    )
    botocore_config = (
        botocore_config.merge(_config_from_extra(config)) if config.config_kwargs else botocore_config
    )
    # Any session may assume a role: the connection's role_arn, or a profile that is a role.
    _install_sts_filter()
    if config.role_arn:
        session = await run_off_loop(lambda: _role_session(config, botocore_config, on_secrets, clock))
        kwargs = config.client_kwargs(with_keys=False)
    else:
        session = await run_off_loop(lambda: _session(config))
        kwargs = config.client_kwargs()
    await run_off_loop(lambda: load_sqs_data(session))
    async with await build_client_off_loop(session, "sqs", config=botocore_config, **kwargs) as client:
        if not (config.role_arn or (config.aws_access_key_id and config.aws_secret_access_key)):
            # The session's own credentials (a profile, maybe a role or SSO, or the default
            # chain) can change at every refresh: each secret is told before a request sends it.
            _tell_secrets_as_found(await session.get_credentials(), on_secrets)
        yield client


def _tell_secrets_as_found(credentials: Any, on_secrets: Callable[[Iterable[str]], None]) -> None:
    """Wrap ``credentials.get_frozen_credentials`` to give ``on_secrets`` each new secret it returns."""
    if credentials is None or not hasattr(credentials, "get_frozen_credentials"):
        return
    frozen = credentials.get_frozen_credentials
    told: set[str] = set()

    async def get_frozen_credentials() -> Any:
        found = await frozen()
        new = [secret for secret in (found.secret_key, found.token) if secret and secret not in told]
        if new:
            told.update(new)
            on_secrets(new)
        return found

    credentials.get_frozen_credentials = get_frozen_credentials


async def build_client_off_loop(session: AioSession, service: str, **kwargs: Any) -> AioBaseClient:
    """
    An aiobotocore client built in a worker thread; entered (its HTTP session opened) by the caller.

    ``create_client`` is a coroutine, but building a client is synchronous work: the service
    model, the client class and its methods, the endpoint rules, the event handlers. It runs on a
    private event loop in a worker thread. Credentials the session finds itself (its provider
    chain may ask the instance metadata service) are found first on the caller's loop, so nothing
    bound to the worker's loop outlives it.
    """
    if not (kwargs.get("aws_access_key_id") and kwargs.get("aws_secret_access_key")):
        await session.get_credentials()
    # ``create_client`` wraps this coroutine in a context manager that opens the HTTP session on
    # the loop it runs on: the client alone is built here, and entered on the caller's loop.
    return await run_off_loop(lambda: asyncio.run(session._create_client(service, **kwargs)))


def _proxy_passwords(config: SqsClientConfig) -> list[str | None]:
    """Passwords in ``config_kwargs.proxies`` URLs (``http://user:password@proxy:3128``)."""
    proxies = config.config_kwargs.get("proxies") or {}
    return [urlsplit(url).password for url in proxies.values() if isinstance(url, str)]


def _config_from_extra(config: SqsClientConfig) -> AioConfig:
    from aiobotocore.config import AioConfig

    return AioConfig(**config.config_kwargs)
