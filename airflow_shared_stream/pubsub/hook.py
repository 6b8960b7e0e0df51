"""
Airflow Connection -> Pub/Sub client config, and Pub/Sub resource names.

Reads the ``google_cloud_platform`` connection as ``apache-airflow-providers-google`` does, so an
existing ``google_cloud_default`` connection works unchanged. ``extra`` may hold (each also under
the provider's old ``extra__google_cloud_platform__<field>`` spelling):

* ``key_path``: path to a service-account JSON key file on the triggerer's machine;
* ``keyfile_dict``: the service-account JSON key itself (a JSON string or an object);
* ``credential_config_file``: a workload identity federation config (a path, or its JSON);
* ``project``: the project a short subscription name belongs to;
* ``scope``: comma-separated OAuth scopes (``https://www.googleapis.com/auth/cloud-platform``
  by default);
* ``is_anonymous``: ``true`` for anonymous credentials (public resources, test servers).

At most one of the key fields may be set. Without any, Google's application default credentials
are used (``GOOGLE_APPLICATION_CREDENTIALS``, the gcloud CLI's login, the metadata server of
GCE, GKE, Cloud Run or Composer), as the Google provider does. ``key_secret_name`` (a key in
Secret Manager) and ``impersonation_chain`` are not supported and refused with a clear error.

When ``PUBSUB_EMULATOR_HOST`` is set (``host:port``), clients talk to that emulator over plain
gRPC with no credentials, exactly as Google's client libraries do; the connection then only
supplies the project.

Credentials never leave this module except inside :class:`PubSubClientConfig`, whose ``repr``
leaves them out; error messages name the connection and the field, never a key's content.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import warnings
from dataclasses import dataclass, field
from typing import Any

from airflow.exceptions import AirflowProviderDeprecationWarning
from airflow.sdk import BaseHook
from airflow.sdk.exceptions import AirflowNotFoundException

from airflow_shared_stream.common.renamed import renamed_names
from airflow_shared_stream.pubsub.errors import PubSubConfigurationError

EMULATOR_HOST_ENV = "PUBSUB_EMULATOR_HOST"
DEFAULT_SCOPES = ("https://www.googleapis.com/auth/cloud-platform",)
_LEGACY_PREFIX = "extra__google_cloud_platform__"
_KEY_FIELDS = ("key_path", "keyfile_dict", "credential_config_file")
_UNSUPPORTED_FIELDS = ("key_secret_name", "impersonation_chain")

# https://cloud.google.com/pubsub/docs/pubsub-basics#resource_names
_RESOURCE_ID = r"(?!goog)[A-Za-z][A-Za-z0-9\-_.~+%]{2,254}"
# Project ids are 6-30 characters; domain-scoped ones look like "example.com:my-project".
_PROJECT_ID = r"(?:[a-z][a-z0-9.\-]*[a-z0-9]:)?[a-z][a-z0-9\-]{4,28}[a-z0-9]"
_FULL_PATH = re.compile(
    rf"^projects/(?P<project>{_PROJECT_ID})/(?P<kind>subscriptions|topics)/(?P<id>{_RESOURCE_ID})$"
)
_SHORT_NAME = re.compile(rf"^{_RESOURCE_ID}$")
_PROJECT = re.compile(rf"^{_PROJECT_ID}$")


@dataclass(frozen=True)
class ResourceName:
    """
    A subscription or topic as a trigger names it: a short id, or ``projects/<p>/<kind>/<id>``.

    Normalisation happens in :meth:`resolve`: a short id takes the given project, and a full
    path must agree with it. The resolved full path is the resource's identity (the stream key
    of a subscription), so a short name and the full path of one subscription are one stream.
    """

    kind: str
    """``subscriptions`` or ``topics``."""
    id: str
    project: str | None
    """The project in a full path; ``None`` for a short name."""

    @classmethod
    def parse(cls, value: object, kind: str, argument: str) -> ResourceName:
        if not isinstance(value, str) or not value:
            raise PubSubConfigurationError(f"{argument} must be a non-empty string, got {value!r}")
        singular = kind[:-1]
        full = _FULL_PATH.match(value)
        if full is not None:
            if full["kind"] != kind:
                raise PubSubConfigurationError(
                    f"{argument}={value!r} names a {full['kind'][:-1]}, not a {singular}"
                )
            return cls(kind=kind, id=full["id"], project=full["project"])
        if _SHORT_NAME.match(value):
            return cls(kind=kind, id=value, project=None)
        raise PubSubConfigurationError(
            f"{argument}={value!r} is not a Pub/Sub {singular} name: expected a {singular} id "
            f"(3-255 characters: a letter first, then letters, digits or -_.~+%, not starting "
            f'with "goog") or projects/<project id>/{kind}/<{singular} id>'
        )

    def resolve(self, project: str | None) -> str:
        """The full path, taking ``project`` for a short name; a full path must agree with it."""
        if self.project is not None:
            if project is not None and project != self.project:
                raise PubSubConfigurationError(
                    f"project_id={project!r} disagrees with the project of "
                    f"projects/{self.project}/{self.kind}/{self.id}; pass one or the other"
                )
            return f"projects/{self.project}/{self.kind}/{self.id}"
        if project is None:
            raise PubSubConfigurationError(
                f"no project for {self.kind[:-1]} {self.id!r}: pass project_id, use the full path "
                f"projects/<project>/{self.kind}/{self.id}, or set extra.project on the connection"
            )
        return f"projects/{project}/{self.kind}/{self.id}"


def validate_project_id(project_id: object, argument: str = "project_id") -> str | None:
    if project_id is None:
        return None
    if not isinstance(project_id, str) or not _PROJECT.match(project_id):
        raise PubSubConfigurationError(f"{argument}={project_id!r} is not a Google Cloud project id")
    return project_id


def emulator_host() -> str | None:
    """``PUBSUB_EMULATOR_HOST`` if set: every client then talks plain gRPC to that emulator."""
    return os.environ.get(EMULATOR_HOST_ENV) or None


@dataclass(frozen=True)
class PubSubClientConfig:
    """What the async clients are built from; ``repr`` leaves the credentials out."""

    project: str | None
    """The project the connection names (``extra.project`` or its key's ``project_id``)."""
    emulator_host: str | None
    credentials_source: str
    """Where the credentials came from, for logs (``key_path``, ``application default``...)."""
    credentials: Any = field(default=None, repr=False)
    secrets: tuple[str, ...] = field(default=(), repr=False)
    """Key material read from the connection, to keep out of logs and error messages."""


class PubSubSharedStreamHook(BaseHook):
    """
    Resolve a ``google_cloud_platform`` Airflow Connection for the Pub/Sub shared stream.

    :param gcp_conn_id: the Airflow connection to read (``google_cloud_default`` by default).
    """

    conn_name_attr = "gcp_conn_id"
    default_conn_name = "google_cloud_default"
    conn_type = "google_cloud_platform"
    hook_name = "Google Cloud Pub/Sub (shared stream)"

    def __init__(self, gcp_conn_id: str = default_conn_name) -> None:
        super().__init__()
        self.gcp_conn_id = gcp_conn_id

    # -- reading the connection -------------------------------------------------------------

    def connection_project(self) -> str | None:
        """
        The project the connection names (``extra.project``, else its key's ``project_id``).

        Synchronous, for the trigger's stream key (the triggerer computes it once per watcher,
        where Airflow's synchronous connection access works). ``None`` if the connection names
        none; application default credentials are not consulted here (that can mean a network
        call), so a deployment relying on them names its project on the connection or the trigger.
        """
        extra = self._extra(self._get_connection_sync())
        return _project_from_extra(extra, self.gcp_conn_id)

    async def aget_client_config(self) -> PubSubClientConfig:
        """Read the connection (through the triggerer's secrets backends) and build the client config."""
        try:
            conn = await BaseHook.aget_connection(self.gcp_conn_id)
        except AirflowNotFoundException:
            raise PubSubConfigurationError(
                f"Airflow connection {self.gcp_conn_id!r} is not defined"
            ) from None
        extra = self._extra(conn)
        # Key files, ADC discovery and the metadata server are blocking: keep them off the loop.
        return await asyncio.to_thread(config_from_extra, extra, self.gcp_conn_id)

    async def aget_client_settings(self) -> PubSubClientConfig:
        """Deprecated: :meth:`aget_client_config`."""
        warnings.warn(
            "PubSubSharedStreamHook.aget_client_settings is deprecated; use aget_client_config",
            AirflowProviderDeprecationWarning,
            stacklevel=2,
        )
        return await self.aget_client_config()

    def _get_connection_sync(self) -> Any:
        try:
            return BaseHook.get_connection(self.gcp_conn_id)
        except AirflowNotFoundException:
            raise PubSubConfigurationError(
                f"Airflow connection {self.gcp_conn_id!r} is not defined"
            ) from None

    def _extra(self, conn: Any) -> dict[str, Any]:
        try:
            extra = conn.extra_dejson or {}
        except Exception:
            extra = None
        if not isinstance(extra, dict):
            raise PubSubConfigurationError(
                f"connection {self.gcp_conn_id!r} has an extra that is not a JSON object"
            )
        return extra


def _field(extra: dict[str, Any], name: str) -> Any:
    """A connection field under its short name or the Google provider's old prefixed one."""
    value = extra.get(name)
    if value in (None, ""):
        value = extra.get(f"{_LEGACY_PREFIX}{name}")
    return None if value == "" else value


def _project_from_extra(extra: dict[str, Any], conn_id: str) -> str | None:
    project = _field(extra, "project")
    if project is not None:
        return validate_project_id(project, f"extra.project of connection {conn_id!r}")
    keyfile = _field(extra, "keyfile_dict")
    if keyfile is not None:
        info = _keyfile_info(keyfile, conn_id)
        return info.get("project_id") or None
    key_path = _field(extra, "key_path")
    if key_path is not None:
        try:
            with open(key_path, encoding="utf-8") as f:
                return json.load(f).get("project_id") or None
        except (OSError, ValueError, AttributeError):
            return None  # reported, with the reason, when the producer loads the key
    return None


def _keyfile_info(keyfile: Any, conn_id: str) -> dict[str, Any]:
    if isinstance(keyfile, dict):
        info = dict(keyfile)
    else:
        try:
            info = json.loads(keyfile)
        except (TypeError, ValueError):
            # The value is a key: say where it is wrong, never what it holds.
            raise PubSubConfigurationError(
                f"extra.keyfile_dict of connection {conn_id!r} is not a JSON object"
            ) from None
        if not isinstance(info, dict):
            raise PubSubConfigurationError(
                f"extra.keyfile_dict of connection {conn_id!r} is not a JSON object"
            )
    if isinstance(info.get("private_key"), str):
        # Keys pasted into a UI or an environment variable often carry escaped newlines.
        info["private_key"] = info["private_key"].replace("\\n", "\n")
    return info


def _scopes(extra: dict[str, Any]) -> tuple[str, ...]:
    scope = _field(extra, "scope")
    if not scope:
        return DEFAULT_SCOPES
    return tuple(s.strip() for s in str(scope).split(",") if s.strip())


def _is_true(value: Any) -> bool:
    return value is True or (isinstance(value, str) and value.strip().lower() in ("true", "1", "yes"))


def config_from_extra(extra: dict[str, Any], conn_id: str) -> PubSubClientConfig:
    """
    Build the client config from a connection's extra (blocking: may read files or the network).

    Order, as the Google provider: emulator (no credentials), anonymous, one key field,
    application default credentials. The project is the one the connection names
    (``extra.project``, else the service-account key's ``project_id``): the same rule the
    trigger's stream key uses, so a short subscription name always resolves to one full path.
    A project that only application default credentials know (a metadata server) is not used:
    name it on the connection or the trigger.
    """
    for name in _UNSUPPORTED_FIELDS:
        if _field(extra, name) is not None:
            raise PubSubConfigurationError(
                f"connection {conn_id!r} sets extra.{name}, which the Pub/Sub shared stream does not "
                "support; give the connection a key (key_path, keyfile_dict, credential_config_file) "
                "or rely on application default credentials"
            )
    project = _project_from_extra(extra, conn_id)
    host = emulator_host()
    if host is not None:
        return PubSubClientConfig(project=project, emulator_host=host, credentials_source="emulator")
    if _is_true(_field(extra, "is_anonymous")):
        from google.auth.credentials import AnonymousCredentials

        return PubSubClientConfig(
            project=project,
            emulator_host=None,
            credentials_source="anonymous",
            credentials=AnonymousCredentials(),
        )
    given = [name for name in _KEY_FIELDS if _field(extra, name) is not None]
    if len(given) > 1:
        raise PubSubConfigurationError(
            f"connection {conn_id!r} sets {' and '.join(f'extra.{n}' for n in given)}: "
            "set only one way of providing the key"
        )
    scopes = _scopes(extra)
    if not given:
        return _application_default(project, scopes, conn_id)
    source = given[0]
    value = _field(extra, source)
    credentials, _, secrets = _load_key(source, value, scopes, conn_id)
    return PubSubClientConfig(
        project=project,
        emulator_host=None,
        credentials_source=f"extra.{source}",
        credentials=credentials,
        secrets=secrets,
    )


def _load_key(
    source: str, value: Any, scopes: tuple[str, ...], conn_id: str
) -> tuple[Any, str | None, tuple[str, ...]]:
    import google.auth
    from google.auth.exceptions import GoogleAuthError
    from google.oauth2 import service_account

    where = f"extra.{source} of connection {conn_id!r}"
    try:
        if source == "key_path":
            path = str(value)
            if not path.endswith(".json"):
                raise PubSubConfigurationError(
                    f"{where} must be a JSON key file (legacy P12 keys are not supported)"
                )
            if not os.path.isfile(path):
                raise PubSubConfigurationError(f"{where} names {path!r}, which is not a readable file")
            credentials = service_account.Credentials.from_service_account_file(path, scopes=scopes)
            return credentials, credentials.project_id, ()
        if source == "keyfile_dict":
            info = _keyfile_info(value, conn_id)
            secrets = tuple(s for s in (info.get("private_key"), info.get("private_key_id")) if s)
            if isinstance(value, str):
                secrets += (value,)
            credentials = service_account.Credentials.from_service_account_info(info, scopes=scopes)
            return credentials, credentials.project_id, secrets
        # credential_config_file: a path to, or the content of, an external-account config.
        if isinstance(value, dict) or (isinstance(value, str) and value.lstrip().startswith("{")):
            info = value if isinstance(value, dict) else json.loads(value)
            credentials, project = google.auth.load_credentials_from_dict(info, scopes=scopes)
        else:
            credentials, project = google.auth.load_credentials_from_file(str(value), scopes=scopes)
        return credentials, project, ()
    except PubSubConfigurationError:
        raise
    except (GoogleAuthError, ValueError, KeyError, TypeError, OSError) as exc:
        # google-auth's messages can quote the key's fields; name only the kind of failure.
        raise PubSubConfigurationError(
            f"{where} could not be loaded as Google credentials ({type(exc).__name__})"
        ) from None


def _application_default(project: str | None, scopes: tuple[str, ...], conn_id: str) -> PubSubClientConfig:
    import google.auth
    from google.auth.exceptions import DefaultCredentialsError

    try:
        credentials, _ = google.auth.default(scopes=scopes)
    except DefaultCredentialsError:
        raise PubSubConfigurationError(
            f"no Google credentials: connection {conn_id!r} has no key (extra.key_path, "
            "extra.keyfile_dict or extra.credential_config_file) and application default "
            "credentials were not found (GOOGLE_APPLICATION_CREDENTIALS, gcloud auth "
            "application-default login, or a metadata server)"
        ) from None
    return PubSubClientConfig(
        project=project,
        emulator_host=None,
        credentials_source="application default credentials",
        credentials=credentials,
    )


__getattr__ = renamed_names(
    __name__,
    globals(),
    {
        "PubSubHook": "PubSubSharedStreamHook",
        "PubSubClientSettings": "PubSubClientConfig",
        "settings_from_extra": "config_from_extra",
    },
)
