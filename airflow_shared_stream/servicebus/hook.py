"""
Airflow Connection -> ``azure.servicebus.aio.ServiceBusClient``, and the entity a stream reads.

Reads the ``azure_service_bus`` connection exactly as Airflow's Azure provider does, so existing
``azure_service_bus_default`` connections work unchanged:

* ``schema`` holds a connection string
  (``Endpoint=sb://<namespace>.servicebus.windows.net/;SharedAccessKeyName=...;SharedAccessKey=...``),
  including the development emulator's form
  (``Endpoint=sb://127.0.0.1:<port>;...;UseDevelopmentEmulator=true;``: plain AMQP, no TLS);
* or ``extra.fully_qualified_namespace`` with ``extra.credential`` (a shared access signature,
  ``SharedAccessSignature sr=...&sig=...&se=...&skn=...``), or without a credential Azure's
  default credential chain (``azure-identity``; ``extra.managed_identity_client_id`` and
  ``extra.workload_identity_tenant_id`` as in the Azure provider).

Extra fields may also be spelled with the provider's old prefix
(``extra__azure_service_bus__fully_qualified_namespace``).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from airflow.sdk import BaseHook
from airflow.sdk.exceptions import AirflowNotFoundException

from airflow_shared_stream.common.off_loop import import_off_loop, run_off_loop
from airflow_shared_stream.servicebus.errors import ServiceBusConfigurationError
from airflow_shared_stream.servicebus.tls import tls_context

_EXTRA_PREFIX = "extra__azure_service_bus__"


@dataclass(frozen=True)
class Entity:
    """A receivable Service Bus entity: a queue, or a topic's subscription."""

    queue_name: str | None = None
    topic_name: str | None = None
    subscription_name: str | None = None

    @classmethod
    def of(cls, queue_name: str | None, topic_name: str | None, subscription_name: str | None) -> Entity:
        """Validate "exactly one queue, or a topic with a subscription"; raise naming what is wrong."""
        for name, value in (
            ("queue_name", queue_name),
            ("topic_name", topic_name),
            ("subscription_name", subscription_name),
        ):
            if value is not None and (not isinstance(value, str) or not value.strip()):
                raise ServiceBusConfigurationError(f"{name} must be a non-empty string, got {value!r}")
            if value is not None and ("/" in value.strip("/") or "$" in value):
                raise ServiceBusConfigurationError(
                    f"{name} must be an entity name, not a path: {value!r} (dead-letter sub-queues are "
                    "not streams of their own)"
                )
        if queue_name is not None:
            if topic_name is not None or subscription_name is not None:
                raise ServiceBusConfigurationError(
                    "give either queue_name, or topic_name with subscription_name, not both"
                )
            return cls(queue_name=queue_name.strip("/"))
        if topic_name is None or subscription_name is None:
            raise ServiceBusConfigurationError(
                "a Service Bus stream reads a queue (queue_name=...) or a topic subscription "
                "(topic_name=... and subscription_name=...): "
                + ("subscription_name is missing" if topic_name else "no entity was given")
            )
        return cls(topic_name=topic_name.strip("/"), subscription_name=subscription_name.strip("/"))

    @property
    def path(self) -> str:
        """The entity path as the service names it (``queue`` or ``topic/Subscriptions/sub``)."""
        if self.queue_name is not None:
            return self.queue_name
        return f"{self.topic_name}/Subscriptions/{self.subscription_name}"

    @property
    def identity(self) -> str:
        """Entity names are case-insensitive on Service Bus: the normalised path."""
        return self.path.lower()


@dataclass(frozen=True)
class ServiceBusClientConfig:
    """
    How to build the client; secrets are kept out of ``repr`` (and so out of logs).

    ``namespace`` is the host (with its port for the emulator) the entity resolves to: part of
    what a stream reads, and safe to log.
    """

    namespace: str
    connection_string: str | None = field(default=None, repr=False)
    sas_token: str | None = field(default=None, repr=False)
    use_default_credential: bool = False
    managed_identity_client_id: str | None = None
    workload_identity_tenant_id: str | None = None

    @property
    def secrets(self) -> tuple[str, ...]:
        """What must never appear in a log line or an error (for the secret scrubber)."""
        found = [self.connection_string, self.sas_token]
        if self.connection_string:
            found.extend(_connection_string_secrets(self.connection_string))
        return tuple(s for s in found if s)

    def make_client(self, **client_kwargs: Any) -> Any:
        """A ``ServiceBusClient`` (aio) for this namespace; nothing is connected yet."""
        from azure.servicebus.aio import ServiceBusClient

        client_kwargs.setdefault("ssl_context", tls_context())  # not one per connection (.tls)

        if self.connection_string:
            return ServiceBusClient.from_connection_string(self.connection_string, **client_kwargs)
        if self.sas_token:
            from azure.core.credentials import AzureSasCredential

            return ServiceBusClient(self.namespace, AzureSasCredential(self.sas_token), **client_kwargs)
        credential = self._default_credential()
        return ClientOwningCredential(
            ServiceBusClient(self.namespace, credential, **client_kwargs), credential
        )

    def _default_credential(self) -> Any:
        """Azure's default credential chain (``azure-identity``), for a connection with no secret."""
        try:
            from azure.identity.aio import DefaultAzureCredential
        except ImportError:
            raise ServiceBusConfigurationError(
                f"connection for namespace {self.namespace!r} has no connection string and no "
                "credential, and azure-identity is not installed for Azure's default credential "
                "chain: pip install azure-identity, or set a connection string"
            ) from None
        return DefaultAzureCredential(
            managed_identity_client_id=self.managed_identity_client_id,
            workload_identity_tenant_id=self.workload_identity_tenant_id,
        )

    @property
    def development_emulator(self) -> bool:
        """Whether the connection string is the development emulator's (``UseDevelopmentEmulator=true``)."""
        return bool(self.connection_string) and _uses_development_emulator(self.connection_string or "")

    def make_admin_client(self, **client_kwargs: Any) -> Any:
        """
        A ``ServiceBusAdministrationClient`` (aio): the namespace's HTTPS/ATOM management endpoint.

        The SDK reaches it at ``https://<endpoint host[:port]>``; a shared access signature goes
        through a ``SharedAccessSignature=`` connection string, the form the SDK takes it in. A
        namespace answers it on HTTPS 443 only, whatever port its endpoint names (its AMQP client
        ignores the port too): the endpoint is the resolved :attr:`namespace`; the emulator's
        keeps its port.
        """
        from azure.servicebus.aio.management import ServiceBusAdministrationClient

        if self.connection_string:
            connection_string = self.connection_string
            if not self.development_emulator:
                rest = [
                    part
                    for part in connection_string.split(";")
                    if part.split("=", 1)[0].strip().lower() not in ("endpoint", "hostname")
                ]
                connection_string = ";".join([f"Endpoint=sb://{self.namespace}/", *rest])
            return ServiceBusAdministrationClient.from_connection_string(connection_string, **client_kwargs)
        if self.sas_token:
            return ServiceBusAdministrationClient.from_connection_string(
                f"Endpoint=sb://{self.namespace}/;SharedAccessSignature={self.sas_token}", **client_kwargs
            )
        credential = self._default_credential()
        return ClientOwningCredential(
            ServiceBusAdministrationClient(self.namespace, credential, **client_kwargs), credential
        )


class ClientOwningCredential:
    """
    A Service Bus client and the default credential made for it alone: closing the client (``close``
    or ``async with``) closes the credential too. The SDK leaves a credential to whoever made it,
    and Azure's default chain holds HTTP sessions (managed identity, workload identity) of its own.
    """

    def __init__(self, client: Any, credential: Any) -> None:
        self._client = client
        self._credential = credential

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)

    async def __aenter__(self) -> ClientOwningCredential:
        await self._client.__aenter__()
        return self

    async def __aexit__(self, *exc_details: Any) -> None:
        try:
            await self._client.__aexit__(*exc_details)
        finally:
            await self._close_credential()

    async def close(self) -> None:
        try:
            await self._client.close()
        finally:
            await self._close_credential()

    async def _close_credential(self) -> None:
        credential, self._credential = self._credential, None
        if credential is not None:
            await credential.close()


EMULATOR_AMQP_PORT = 5672
"""The development emulator's port (plain AMQP) when its endpoint names none, as the SDK's."""


def parse_connection_string(connection_string: str, conn_id: str, *, with_sdk: bool = True) -> str:
    """
    Check a Service Bus connection string and return the namespace it resolves to.

    Uses the SDK's own parser, so what passes here is what the client accepts; its error text
    is replaced, since a malformed string may be quoted in it. The SDK's public parser reads the
    ``Endpoint`` key as written, its clients ``endpoint`` or ``HostName`` in any case, the last one
    winning: a string that names the host (or the emulator) twice is refused, or the clients would
    sign for a host other than the namespace resolved here.

    ``with_sdk=False`` reads the string as the SDK's parser does, refusals included, without
    importing the SDK: the stream key is computed on the triggerer's event loop, where the SDK's
    first import held it. The stream refuses to connect where the two readings differ
    (``aget_client_config``).
    """
    named = [part.split("=", 1)[0].strip().lower() for part in connection_string.split(";")]
    for names in (("endpoint", "hostname"), ("usedevelopmentemulator",)):
        if sum(name in names for name in named) > 1:
            raise ServiceBusConfigurationError(
                f"the connection string of Airflow connection {conn_id!r} names "
                f"{' or '.join(names)} more than once: give one Endpoint=sb://<namespace>/"
                + ("" if "endpoint" in names else " and at most one UseDevelopmentEmulator")
            )
    if not with_sdk:
        return _namespace_read_plainly(connection_string, conn_id)
    from azure.servicebus import parse_connection_string as sdk_parse

    try:
        properties = sdk_parse(connection_string)
    except Exception:
        raise ServiceBusConfigurationError(
            f"the connection string of Airflow connection {conn_id!r} is not a Service Bus "
            "connection string (expected Endpoint=sb://<namespace>/;SharedAccessKeyName=<name>;"
            "SharedAccessKey=<key>, or SharedAccessSignature=<token>)"
        ) from None
    namespace = urlsplit(properties.endpoint).netloc or properties.fully_qualified_namespace
    if not namespace:
        raise ServiceBusConfigurationError(
            f"the connection string of Airflow connection {conn_id!r} names no namespace endpoint"
        )
    return normalise_namespace(namespace, emulator=_uses_development_emulator(connection_string))


def _namespace_read_plainly(connection_string: str, conn_id: str) -> str:
    """
    The namespace the SDK's parser reads from the string, read without the SDK.

    Follows ``azure.servicebus.parse_connection_string`` (7.15), refusals included: a string the
    SDK refuses is refused here, in the watcher that names it, when its stream key is computed.
    Refused only when the stream connects, it would fail the stream of every watcher sharing
    that key, other connections' watchers included (the first watcher's connection builds it).
    """
    pairs = [part.split("=", 1) for part in connection_string.strip().rstrip(";").split(";")]
    settings = dict(pair for pair in pairs if len(pair) == 2)
    signature = None
    for name, value in settings.items():
        if name.lower() == "sharedaccesssignature":
            signature = value
    key, key_name = settings.get("SharedAccessKey"), settings.get("SharedAccessKeyName")
    endpoint = settings.get("Endpoint")
    host = urlsplit(endpoint).netloc.strip() if endpoint else ""
    if (
        any(len(pair) != 2 for pair in pairs)
        or not host
        or bool(key) != bool(key_name)
        or (signature and key)
        or not (signature or key)
    ):
        raise ServiceBusConfigurationError(
            f"the connection string of Airflow connection {conn_id!r} is not a Service Bus "
            "connection string (expected Endpoint=sb://<namespace>/;SharedAccessKeyName=<name>;"
            "SharedAccessKey=<key>, or SharedAccessSignature=<token>)"
        )
    namespace = urlsplit(f"sb://{host}/").netloc or host
    return normalise_namespace(namespace, emulator=_uses_development_emulator(connection_string))


def normalise_namespace(host: str, *, emulator: bool) -> str:
    """
    The namespace a host spelling reaches, spelled one way: what the stream key compares.

    Follows the SDK: over TLS (a real namespace) it connects to the host alone, whatever port
    the endpoint names (``sb://ns.servicebus.windows.net:443/`` is ``ns.servicebus.windows.net``);
    the development emulator speaks plain AMQP on the endpoint's port, 5672 when it names none
    (``sb://localhost`` is ``localhost:5672``). Host names are case-insensitive. Names are not
    resolved through DNS: ``localhost`` and ``127.0.0.1`` stay two spellings.
    """
    parts = urlsplit(f"//{host.strip()}")
    try:
        hostname, port = parts.hostname, parts.port
    except ValueError:
        hostname, port = None, None
    if not hostname:
        raise ServiceBusConfigurationError(f"{host!r} is not a Service Bus namespace host name")
    if ":" in hostname:  # an IPv6 literal keeps its brackets
        hostname = f"[{hostname}]"
    if not emulator:
        return hostname
    return f"{hostname}:{port or EMULATOR_AMQP_PORT}"


def _uses_development_emulator(connection_string: str) -> bool:
    """Whether the SDK treats the string as the emulator's (``UseDevelopmentEmulator=true``)."""
    for part in connection_string.split(";"):
        name, _, value = part.partition("=")
        if name.strip().lower() == "usedevelopmentemulator":
            return value.strip() == "true"
    return False


def _connection_string_secrets(connection_string: str) -> list[str]:
    secrets = []
    for part in connection_string.split(";"):
        name, _, value = part.partition("=")
        if name.strip().lower() in ("sharedaccesskey", "sharedaccesssignature") and value:
            secrets.append(value)
    return secrets


class ServiceBusSharedStreamHook(BaseHook):
    """
    Resolve an ``azure_service_bus`` Airflow Connection into Service Bus client settings.

    :param azure_service_bus_conn_id: the connection to read (``azure_service_bus_default``).
    """

    conn_name_attr = "azure_service_bus_conn_id"
    default_conn_name = "azure_service_bus_default"
    conn_type = "azure_service_bus"
    hook_name = "Azure Service Bus (shared stream)"

    def __init__(self, azure_service_bus_conn_id: str = default_conn_name) -> None:
        super().__init__()
        self.conn_id = azure_service_bus_conn_id

    def namespace(self) -> str:
        """
        The namespace the connection resolves to, normalised (:func:`normalise_namespace`).

        Synchronous, for the stream key: the triggerer computes it in the trigger's own task,
        where Airflow's synchronous connection access works. Reads the connection, never the
        service.
        """
        try:
            conn = BaseHook.get_connection(self.conn_id)
        except AirflowNotFoundException:
            raise ServiceBusConfigurationError(
                f"Airflow connection {self.conn_id!r} is not defined"
            ) from None
        return self.config_from(conn, with_sdk=False).namespace

    async def aget_client_config(self) -> ServiceBusClientConfig:
        """Read the connection (through the triggerer's secrets backends) and build the config."""
        try:
            conn = await BaseHook.aget_connection(self.conn_id)
        except AirflowNotFoundException:
            raise ServiceBusConfigurationError(
                f"Airflow connection {self.conn_id!r} is not defined"
            ) from None
        config = self.config_from(conn)
        if config.connection_string and config.namespace != self.config_from(conn, with_sdk=False).namespace:
            # The stream key read the string without the SDK: connect only where it says.
            raise ServiceBusConfigurationError(
                f"the connection string of Airflow connection {self.conn_id!r} names its namespace "
                "in a form read two ways: give one Endpoint=sb://<namespace>/"
            )
        await run_off_loop(tls_context)
        if config.use_default_credential:
            # Azure's credential chain is an SDK of its own (azure-identity): imported off the
            # triggerer's loop, as the Service Bus SDK is.
            with contextlib.suppress(ImportError):  # make_client names the missing package
                await import_off_loop(["azure.identity.aio"])
        return config

    def config_from(self, conn: Any, *, with_sdk: bool = True) -> ServiceBusClientConfig:
        """Build the config from a Connection object (pure: no I/O; see :func:`parse_connection_string`)."""
        extra = conn.extra_dejson or {}
        connection_string = (conn.schema or "").strip() or _extra(extra, "connection_string")
        if connection_string:
            return ServiceBusClientConfig(
                namespace=parse_connection_string(connection_string, self.conn_id, with_sdk=with_sdk),
                connection_string=connection_string,
            )
        namespace = (_extra(extra, "fully_qualified_namespace") or "").strip()
        if not namespace:
            raise ServiceBusConfigurationError(
                f"Airflow connection {self.conn_id!r} has neither a connection string (in its "
                "Connection String / schema field) nor extra.fully_qualified_namespace"
            )
        if "://" in namespace or "/" in namespace or ";" in namespace:
            raise ServiceBusConfigurationError(
                f"extra.fully_qualified_namespace of Airflow connection {self.conn_id!r} must be a host "
                "name such as <namespace>.servicebus.windows.net, not a URL or a connection string"
            )
        namespace = normalise_namespace(namespace, emulator=False)
        credential = _extra(extra, "credential")
        if credential and ";" in credential:
            # The management client takes it inside a connection string: a ";" would add keys (a host).
            raise ServiceBusConfigurationError(
                f"extra.credential of Airflow connection {self.conn_id!r} must be a shared access "
                "signature (SharedAccessSignature sr=...&sig=...&se=...&skn=...), not a connection "
                "string: put a connection string in the Connection String field"
            )
        if credential:
            return ServiceBusClientConfig(namespace=namespace, sas_token=credential)
        return ServiceBusClientConfig(
            namespace=namespace,
            use_default_credential=True,
            managed_identity_client_id=_extra(extra, "managed_identity_client_id"),
            workload_identity_tenant_id=_extra(extra, "workload_identity_tenant_id"),
        )


def _extra(extra: dict[str, Any], name: str) -> Any:
    value = extra.get(name)
    if value in (None, ""):
        value = extra.get(_EXTRA_PREFIX + name)
    return value or None
