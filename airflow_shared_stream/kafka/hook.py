"""
The ``kafka`` Airflow Connection, translated to aiokafka client arguments.

Airflow's Kafka provider keeps client settings in the connection's extra, spelled the way
librdkafka (confluent-kafka) spells them: ``bootstrap.servers``, ``group.id``,
``security.protocol``, ``sasl.*``, ``ssl.*``. A deployment that already has such a connection
must be able to point this provider's triggers at it unchanged, so this module reads that
spelling and produces the keyword arguments of :class:`aiokafka.AIOKafkaConsumer` and
:class:`aiokafka.AIOKafkaProducer`.

Secrets (``sasl.password``, ``ssl.key.password``) only ever live in the returned
:class:`KafkaClientConfig`, whose ``repr`` hides them; error messages name settings, never
their values.
"""

from __future__ import annotations

import ssl
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from airflow.exceptions import AirflowProviderDeprecationWarning
from airflow.sdk import BaseHook

from airflow_shared_stream.common.errors import SecretScrubber
from airflow_shared_stream.common.off_loop import run_off_loop
from airflow_shared_stream.common.renamed import renamed_names
from airflow_shared_stream.kafka.errors import KafkaConfigurationError

SECURITY_PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
SASL_MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")
ISOLATION_LEVELS = ("read_committed", "read_uncommitted")

_OFFSET_RESET = {
    "earliest": "earliest",
    "smallest": "earliest",
    "beginning": "earliest",
    "latest": "latest",
    "largest": "latest",
    "end": "latest",
    "error": "none",
    "none": "none",
}

# Integer librdkafka setting -> aiokafka argument. Settings the shared consumer
# cannot honour are refused or ignored explicitly below rather than passed through blindly.
_CONSUMER_INT_SETTINGS = {
    "session.timeout.ms": "session_timeout_ms",
    "heartbeat.interval.ms": "heartbeat_interval_ms",
    "max.poll.interval.ms": "max_poll_interval_ms",
    "fetch.max.bytes": "fetch_max_bytes",
    "fetch.min.bytes": "fetch_min_bytes",
    "fetch.wait.max.ms": "fetch_max_wait_ms",
    "max.partition.fetch.bytes": "max_partition_fetch_bytes",
    "request.timeout.ms": "request_timeout_ms",
    "metadata.max.age.ms": "metadata_max_age_ms",
    "retry.backoff.ms": "retry_backoff_ms",
    "connections.max.idle.ms": "connections_max_idle_ms",
}
_COMMON_INT_SETTINGS = {
    "request.timeout.ms",
    "metadata.max.age.ms",
    "retry.backoff.ms",
    "connections.max.idle.ms",
}

# Settings that are understood and deliberately not forwarded: the shared consumer owns them.
_OWNED_SETTINGS = {
    "enable.auto.commit",  # always off: the ack channel commits (checked below)
    "partition.assignment.strategy",  # no group membership: the stream assigns every partition
    "auto.commit.interval.ms",
    "enable.auto.offset.store",
    "enable.partition.eof",
    "key.deserializer",
    "value.deserializer",
}

_TRUE = {"true", "1", "yes", "on"}
_FALSE = {"false", "0", "no", "off"}


def _flag(name: str, value: Any) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    raise KafkaConfigurationError(f"Kafka setting {name!r} must be true or false")


def _int(name: str, value: Any) -> int:
    try:
        return int(str(value).strip())
    except ValueError:
        raise KafkaConfigurationError(f"Kafka setting {name!r} must be an integer") from None


@dataclass(frozen=True)
class KafkaClientConfig:
    """
    Client arguments for one Kafka cluster, split by who uses them.

    ``common`` goes to every aiokafka client (consumer and dead-letter producer), ``consumer``
    only to the consumer. ``group_id`` is the connection's ``group.id``, if any: the prefix of
    the per-stream group ids derived for triggers that name no ``group_id`` (it is never used as
    a group itself, which would put different streams into one group; see
    :mod:`airflow_shared_stream.kafka.identity`).
    """

    common: dict[str, Any] = field(repr=False)
    consumer: dict[str, Any] = field(repr=False)
    group_id: str | None = None
    ignored: tuple[str, ...] = ()

    def __repr__(self) -> str:  # secrets live in ``common``: show only where we connect
        return (
            f"KafkaClientConfig(bootstrap_servers={self.common.get('bootstrap_servers')!r}, "
            f"security_protocol={self.common.get('security_protocol')!r}, group_id={self.group_id!r})"
        )

    @property
    def secrets(self) -> tuple[str, ...]:
        """Secret values in this config, so error text can be scrubbed of them."""
        values = (self.common.get("sasl_plain_password"), self.common.get("_ssl_key_password"))
        return tuple(v for v in values if v)

    def scrubber(self) -> SecretScrubber:
        """
        A scrubber for this config's secrets, as they appear in text and in aiokafka's logs.

        At DEBUG, ``aiokafka.conn`` logs every request it sends, and the SASL/PLAIN authenticate
        request carries the password inside the ``repr`` of the request bytes: that spelling is
        scrubbed too.
        """
        scrubber = SecretScrubber()
        for secret in self.secrets:
            scrubber.add(secret, repr(secret.encode())[2:-1])
        return scrubber

    def consumer_kwargs(self, group_id: str) -> dict[str, Any]:
        """Arguments for :class:`aiokafka.AIOKafkaConsumer`: manual commits, always."""
        kwargs = {k: v for k, v in self.common.items() if not k.startswith("_")}
        kwargs.update(self.consumer)
        kwargs["group_id"] = group_id
        kwargs["enable_auto_commit"] = False
        return kwargs

    def producer_kwargs(self) -> dict[str, Any]:
        """Arguments for the dead-letter :class:`aiokafka.AIOKafkaProducer`: every replica acks."""
        kwargs = {k: v for k, v in self.common.items() if not k.startswith("_")}
        kwargs["acks"] = "all"
        return kwargs


TLS_FILE_SETTINGS = ("ssl.ca.location", "ssl.ca.pem", "ssl.certificate.location", "ssl.key.location")
"""The TLS settings a Kafka connection names its CA, certificate and key with."""


def _ssl_context(extra: Mapping[str, Any]) -> tuple[ssl.SSLContext, str | None]:
    from aiokafka.helpers import create_ssl_context

    key_password = extra.get("ssl.key.password")
    for setting in ("ssl.ca.location", "ssl.certificate.location", "ssl.key.location"):
        path = extra.get(setting)
        if path:
            try:
                with open(path, "rb"):
                    pass
            except OSError as exc:
                raise KafkaConfigurationError(
                    f"the Kafka connection's {setting} {path!r} cannot be read: {exc.strerror or exc}"
                ) from None
    try:
        context = create_ssl_context(
            cafile=extra.get("ssl.ca.location"),
            cadata=extra.get("ssl.ca.pem"),
            certfile=extra.get("ssl.certificate.location"),
            keyfile=extra.get("ssl.key.location"),
            password=key_password,
        )
    except (OSError, ValueError) as exc:  # ssl.SSLError is an OSError: OpenSSL refused a file's content
        given = [name for name in TLS_FILE_SETTINGS if extra.get(name)]
        raise KafkaConfigurationError(
            f"the Kafka connection's TLS settings ({', '.join(given)}) were refused: "
            f"{getattr(exc, 'reason', None) or type(exc).__name__} (a certificate or key that is "
            "not PEM, a key that does not match its certificate, or a wrong ssl.key.password)"
        ) from None
    algorithm = str(extra.get("ssl.endpoint.identification.algorithm", "https")).strip().lower()
    if algorithm in ("", "none"):
        context.check_hostname = False
    if "enable.ssl.certificate.verification" in extra and not _flag(
        "enable.ssl.certificate.verification", extra["enable.ssl.certificate.verification"]
    ):
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    return context, key_password


def client_config_from_extra(
    extra: Mapping[str, Any], *, login: str | None = None, password: str | None = None
) -> KafkaClientConfig:
    """
    Translate a ``kafka`` connection's extra (librdkafka spelling) into aiokafka arguments.

    ``login``/``password`` of the connection stand in for ``sasl.username``/``sasl.password``
    when the extra does not set them, so the secret can live in the connection's password
    field (masked in the UI) instead of the extra.

    Raises :class:`KafkaConfigurationError` for settings the shared consumer cannot run with
    safely: no bootstrap servers, auto-commit turned on, an unknown security protocol, SASL
    mechanism or isolation level.
    """
    extra = dict(extra)
    servers = extra.get("bootstrap.servers") or extra.get("metadata.broker.list")
    if not servers:
        raise KafkaConfigurationError("the Kafka connection's extra must set 'bootstrap.servers'")
    if isinstance(servers, str):
        servers = [s.strip() for s in servers.split(",") if s.strip()]
    if "enable.auto.commit" in extra and _flag("enable.auto.commit", extra["enable.auto.commit"]):
        raise KafkaConfigurationError(
            "the Kafka connection sets enable.auto.commit=true; the shared stream commits offsets "
            "itself, only after trigger events are persisted, and auto-commit would commit "
            "messages that were never handled. Set enable.auto.commit=false (or remove it)."
        )

    protocol = str(extra.get("security.protocol", "PLAINTEXT")).strip().upper()
    if protocol not in SECURITY_PROTOCOLS:
        raise KafkaConfigurationError(
            f"unsupported security.protocol {protocol!r}; expected one of {', '.join(SECURITY_PROTOCOLS)}"
        )
    common: dict[str, Any] = {"bootstrap_servers": list(servers), "security_protocol": protocol}
    if extra.get("client.id"):
        common["client_id"] = str(extra["client.id"])

    if protocol.startswith("SASL_"):
        mechanism = (
            str(extra.get("sasl.mechanism") or extra.get("sasl.mechanisms") or "PLAIN").strip().upper()
        )
        if mechanism not in SASL_MECHANISMS:
            raise KafkaConfigurationError(
                f"unsupported sasl.mechanism {mechanism!r}; expected one of {', '.join(SASL_MECHANISMS)}"
            )
        username = extra.get("sasl.username") or login
        secret = extra.get("sasl.password") or password
        if not username or not secret:
            raise KafkaConfigurationError(
                f"security.protocol {protocol} needs sasl.username and sasl.password "
                "(in the extra, or the connection's login and password)"
            )
        common.update(
            sasl_mechanism=mechanism, sasl_plain_username=str(username), sasl_plain_password=str(secret)
        )
    if protocol in ("SSL", "SASL_SSL"):
        context, key_password = _ssl_context(extra)
        common["ssl_context"] = context
        if key_password:
            common["_ssl_key_password"] = key_password

    consumer: dict[str, Any] = {}
    reset = str(extra.get("auto.offset.reset", "latest")).strip().lower()
    if reset not in _OFFSET_RESET:
        raise KafkaConfigurationError(f"unsupported auto.offset.reset {reset!r}")
    consumer["auto_offset_reset"] = _OFFSET_RESET[reset]
    # librdkafka's default (and so the official provider's): batch CRCs are not verified; TCP and
    # the broker already checksum the data, and verifying costs a pass over every record.
    consumer["check_crcs"] = _flag("check.crcs", extra.get("check.crcs", False))
    # librdkafka's default (and so what a connection written for the official provider expects):
    # records of aborted transactions never fire an asset event. aiokafka's is read_uncommitted.
    isolation = str(extra.get("isolation.level", "read_committed")).strip().lower()
    if isolation not in ISOLATION_LEVELS:
        raise KafkaConfigurationError(
            f"unsupported isolation.level {isolation!r}; expected one of {', '.join(ISOLATION_LEVELS)}"
        )
    consumer["isolation_level"] = isolation
    for name, argument in _CONSUMER_INT_SETTINGS.items():
        if name in extra:
            target = common if name in _COMMON_INT_SETTINGS else consumer
            target[argument] = _int(name, extra[name])

    handled = {
        "bootstrap.servers",
        "metadata.broker.list",
        "security.protocol",
        "client.id",
        "group.id",
        "auto.offset.reset",
        "isolation.level",
        "check.crcs",
        "sasl.mechanism",
        "sasl.mechanisms",
        "sasl.username",
        "sasl.password",
        *_CONSUMER_INT_SETTINGS,
        *_OWNED_SETTINGS,
    }
    ignored = tuple(sorted(k for k in extra if k not in handled and not k.startswith("ssl.")))
    group_id = str(extra["group.id"]) if extra.get("group.id") else None
    return KafkaClientConfig(common=common, consumer=consumer, group_id=group_id, ignored=ignored)


AIOKAFKA_LOGGERS = (
    "aiokafka",
    "aiokafka.conn",
    "aiokafka.producer.sender",
    "aiokafka.consumer.group_coordinator",
)


_aiokafka_logs = SecretScrubber()
"""One scrubber for aiokafka's loggers, holding the secrets of every stream started here."""


def protect_secrets(config: KafkaClientConfig) -> SecretScrubber:
    """
    Register a config's secrets with Airflow's secrets masker and scrub them from aiokafka's logs.

    Called when a stream starts (the hook reads its connection), not at import: importing the
    provider must not touch logging configuration. Returns the config's own scrubber, for error
    messages.
    """
    scrubber = config.scrubber()
    for secret in config.secrets:
        _aiokafka_logs.add(secret, repr(secret.encode())[2:-1])
    _aiokafka_logs.install(*AIOKAFKA_LOGGERS)  # idempotent: one filter per logger
    return scrubber


class KafkaSharedStreamHook(BaseHook):
    """
    Read a ``kafka`` connection (Airflow's Kafka provider's format) for aiokafka clients.

    Only :meth:`aget_client_config` touches the connection; it is awaited inside the producer's
    ``open_stream`` (never at trigger construction, which runs in the Dag processor).
    """

    conn_name_attr = "kafka_config_id"
    default_conn_name = "kafka_default"
    conn_type = "kafka"
    hook_name = "Apache Kafka (shared stream, aiokafka)"

    def __init__(self, kafka_config_id: str = default_conn_name, *, kafka_conn_id: str | None = None) -> None:
        super().__init__()
        if kafka_conn_id is not None:
            warnings.warn(
                "KafkaSharedStreamHook(kafka_conn_id=...) is deprecated; use kafka_config_id=... "
                "(the name Airflow's Kafka provider uses)",
                AirflowProviderDeprecationWarning,
                stacklevel=2,
            )
            kafka_config_id = kafka_conn_id
        self.kafka_config_id = kafka_config_id

    @property
    def kafka_conn_id(self) -> str:
        """Deprecated alias of :attr:`kafka_config_id`."""
        return self.kafka_config_id

    async def aget_client_config(self) -> KafkaClientConfig:
        """Fetch the connection and translate it; raises :class:`KafkaConfigurationError` on bad settings."""
        connection = await BaseHook.aget_connection(self.kafka_config_id)
        # In a worker thread, as Pub/Sub's: a TLS connection's context reads and parses its CA
        # and certificate files, file I/O that must not hold the triggerer's loop.
        config = await run_off_loop(
            lambda: client_config_from_extra(
                connection.extra_dejson, login=connection.login, password=connection.password
            )
        )
        protect_secrets(config)
        if config.ignored:
            self.log.warning(
                "Kafka connection %r: settings not supported by the aiokafka shared stream, ignored: %s",
                self.kafka_config_id,
                ", ".join(config.ignored),
            )
        return config


__getattr__ = renamed_names(
    __name__, globals(), {"KafkaHook": "KafkaSharedStreamHook", "KafkaConfigError": "KafkaConfigurationError"}
)
