"""
The Service Bus test server's management endpoint: HTTPS/ATOM on the namespace's own port.

The SDK's ``ServiceBusAdministrationClient`` reaches a namespace at ``https://<endpoint host:port>``
(it keeps the port of ``Endpoint=sb://host:port``), so the test server answers it on the port its
AMQP clients use: a front listens there and sniffs the first byte of each connection, a TLS
ClientHello (``0x16``) is served here, anything else (``AMQP...``) is spliced to proton. It answers
the runtime-properties GET of a queue (``/<queue>``) and of a subscription
(``/<topic>/subscriptions/<subscription>``) with the ATOM entry the service documents (a
``QueueDescription`` / ``SubscriptionDescription`` with ``MessageCount`` and ``CountDetails``), an
empty feed for an entity that does not exist, and 401 for a signature it cannot verify or a key
without ``Manage`` rights (``ServiceBusServer.manage_keys``).
"""

from __future__ import annotations

import contextlib
import datetime
import ipaddress
import socket
import ssl
import tempfile
import threading
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit
from xml.sax.saxutils import escape

TLS_HANDSHAKE = 0x16
ATOM = "http://www.w3.org/2005/Atom"
CONNECT = "http://schemas.microsoft.com/netservices/2010/10/servicebus/connect"
COUNTS = "http://schemas.microsoft.com/netservices/2011/06/servicebus"

_certificate_lock = threading.Lock()
_certificate: tuple[Path, Path] | None = None


def test_certificate() -> tuple[Path, Path]:
    """``(certificate, key)``: a self-signed certificate for ``127.0.0.1``, made once per process."""
    global _certificate
    with _certificate_lock:
        if _certificate is None:
            _certificate = _make_certificate(Path(tempfile.mkdtemp(prefix="servicebus-tls-")))
        return _certificate


def _make_certificate(directory: Path) -> tuple[Path, Path]:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.datetime.now(datetime.UTC)
    certificate = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(days=1))
        .not_valid_after(now + datetime.timedelta(days=7))
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), False
        )
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), True)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = directory / "cert.pem", directory / "key.pem"
    cert_path.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    return cert_path, key_path


def trust_test_certificate() -> None:
    """Make this process's aiohttp (the SDK's transport) trust the test certificate."""
    from aiohttp import connector

    connector._SSL_CONTEXT_VERIFIED.load_verify_locations(cafile=str(test_certificate()[0]))


class ManagementFront:
    """Listen on ``public_port``; serve HTTPS here, splice everything else to ``amqp_port``."""

    def __init__(self, server: Any, public_port: int, amqp_port: int) -> None:
        self.server = server
        self.public_port = public_port
        self.amqp_port = amqp_port
        cert, key = test_certificate()
        self._tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self._tls.load_cert_chain(str(cert), str(key))
        self._listener: socket.socket | None = None
        self._open: set[socket.socket] = set()
        self._lock = threading.Lock()

    def start(self) -> None:
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.public_port))
        listener.listen(64)
        self._listener = listener
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()

    def stop(self) -> None:
        """Stop listening and drop every connection, as the namespace's gateway going away."""
        if self._listener is not None:
            self._listener.close()
            self._listener = None
        with self._lock:
            for sock in list(self._open):
                _close(sock)
            self._open.clear()

    def _track(self, sock: socket.socket) -> None:
        with self._lock:
            self._open.add(sock)

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return
            self._track(client)
            threading.Thread(target=self._route, args=(client,), daemon=True).start()

    def _route(self, client: socket.socket) -> None:
        try:
            first = client.recv(1, socket.MSG_PEEK)
        except OSError:
            return _close(client)
        if not first:
            return _close(client)
        if first[0] == TLS_HANDSHAKE:
            return self._serve_https(client)
        try:
            upstream = socket.create_connection(("127.0.0.1", self.amqp_port))
        except OSError:
            return _close(client)
        self._track(upstream)
        threading.Thread(target=_pipe, args=(upstream, client), daemon=True).start()
        _pipe(client, upstream)

    def _serve_https(self, client: socket.socket) -> None:
        try:
            tls = self._tls.wrap_socket(client, server_side=True)
        except (OSError, ssl.SSLError):
            return _close(client)
        self._track(tls)
        try:
            with contextlib.suppress(OSError):
                _AtomHandler(tls, ("127.0.0.1", 0), self)
        finally:
            _close(tls)


def _pipe(source: socket.socket, sink: socket.socket) -> None:
    """Copy ``source`` to ``sink`` until either end closes; then close both."""
    try:
        while chunk := source.recv(65536):
            sink.sendall(chunk)
    except OSError:
        pass
    finally:
        _close(source)
        _close(sink)


def _close(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)
    sock.close()


class _AtomHandler(BaseHTTPRequestHandler):
    """The runtime-properties GET of a queue or a subscription, as the service answers it."""

    protocol_version = "HTTP/1.1"
    server: Any

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet: the test log is not the place for an access log."""

    def do_GET(self) -> None:
        from tests.support.servicebus_server import _valid_sas

        namespace = self.server.server
        path = unquote(urlsplit(self.path).path).strip("/")
        with namespace._lock:
            namespace.requests["management GET"] += 1
            keys = namespace.sas_keys
            token = self.headers.get("Authorization")
            if keys is not None and not _valid_sas(token, keys):
                namespace.refused_tokens += 1
                return self._reply(401, _error(401, "InvalidSignature: The token has an invalid signature."))
            if namespace.manage_keys is not None and _key_name(token) not in namespace.manage_keys:
                namespace.requests["management GET refused"] += 1
                return self._reply(401, _error(401, "Manage,EntityRead claims required for this operation."))
            entity = namespace._receivable(path) if "$" not in path else None
            if entity is None:
                return self._reply(200, _empty_feed(self.headers.get("Host", "")))
            active = len(entity.available) + len(entity.locked)
            assert entity.dead_letter is not None
            dead = len(entity.dead_letter.available) + len(entity.dead_letter.locked)
        kind = "SubscriptionDescription" if "/subscriptions/" in path.lower() else "QueueDescription"
        self._reply(200, _entry(self.headers.get("Host", ""), path, kind, active, dead))

    def _reply(self, status: int, body: str) -> None:
        encoded = body.encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/atom+xml;type=entry;charset=utf-8")
        self.send_header("Content-Length", str(len(encoded)))
        self.end_headers()
        self.wfile.write(encoded)


def _key_name(token: str | None) -> str:
    """The ``skn`` (key name) of a ``SharedAccessSignature`` token."""
    for part in (token or "").split("&"):
        name, _, value = part.partition("=")
        if name == "skn":
            return value
    return ""


def _entry(host: str, path: str, kind: str, active: int, dead: int) -> str:
    updated = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    url = escape(f"https://{host}/{path}?api-version=2021-05")
    name = escape(path.rsplit("/", 1)[-1])
    return (
        f'<entry xmlns="{ATOM}"><id>{url}</id><title type="text">{name}</title>'
        f"<published>{updated}</published><updated>{updated}</updated>"
        f'<link rel="self" href="{url}"/>'
        f'<content type="application/xml"><{kind} xmlns="{CONNECT}" '
        'xmlns:i="http://www.w3.org/2001/XMLSchema-instance">'
        f"<MessageCount>{active + dead}</MessageCount>"
        f'<CountDetails xmlns:d2p1="{COUNTS}">'
        f"<d2p1:ActiveMessageCount>{active}</d2p1:ActiveMessageCount>"
        f"<d2p1:DeadLetterMessageCount>{dead}</d2p1:DeadLetterMessageCount>"
        "<d2p1:ScheduledMessageCount>0</d2p1:ScheduledMessageCount>"
        "<d2p1:TransferMessageCount>0</d2p1:TransferMessageCount>"
        "<d2p1:TransferDeadLetterMessageCount>0</d2p1:TransferDeadLetterMessageCount>"
        f"</CountDetails><CreatedAt>{updated}</CreatedAt><UpdatedAt>{updated}</UpdatedAt>"
        f"<AccessedAt>{updated}</AccessedAt></{kind}></content></entry>"
    )


def _empty_feed(host: str) -> str:
    """What the service answers for an entity that does not exist: a feed with no entry."""
    updated = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    url = escape(f"https://{host}/$Resources")
    return (
        f'<feed xmlns="{ATOM}"><title type="text">Publicly Listed Services</title>'
        '<subtitle type="text">The list of publicly-listed services.</subtitle>'
        f"<id>uuid:{url}</id><updated>{updated}</updated><generator>Service Bus 1.1</generator></feed>"
    )


def _error(code: int, detail: str) -> str:
    return f"<Error><Code>{code}</Code><Detail>{escape(detail)}</Detail></Error>"
