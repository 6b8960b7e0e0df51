"""
A recording HTTP proxy: count the requests a client really sends to a broker's HTTP API.

Benchmarks and tests put it between the code under test and the broker (moto's SQS server) and
read the operation counts off the wire, so "broker requests per message" is counted, never
estimated from the producer's own bookkeeping. The request side is parsed (the operation is the
``X-Amz-Target`` header of AWS's JSON protocol, or the ``Action`` parameter of its query
protocol); the response side is pumped through untouched.

Runs its own event loop in a thread, so it works from synchronous and asynchronous code alike::

    with RecordingProxy("127.0.0.1", moto_port) as proxy:
        endpoint = proxy.endpoint_url  # give this to the client under test
        ...
        proxy.counts()  # Counter({"ReceiveMessage": 101, "DeleteMessageBatch": 100, ...})
        proxy.signers()  # Counter({("ReceiveMessage", "AKID..."): 101, ...}): who signed what
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import re
import threading
import time
from typing import Self
from urllib.parse import parse_qs

_MAX_HEAD = 64 * 1024
_CREDENTIAL = re.compile(r"Credential=([^/,\s]+)/")


def operation_of(head: bytes, body: bytes) -> str:
    """The AWS operation a request calls (``ReceiveMessage``), or its method and path."""
    lines = head.decode("latin-1").split("\r\n")
    for line in lines[1:]:
        name, _, value = line.partition(":")
        if name.strip().lower() == "x-amz-target":
            return value.strip().rsplit(".", 1)[-1]
    action = parse_qs(body.decode("latin-1")).get("Action")
    if action:
        return action[0]
    return " ".join(lines[0].split(" ")[:2])


def signer_of(head: bytes) -> str:
    """The access key id a SigV4 request was signed with (``""`` for an unsigned request)."""
    for line in head.decode("latin-1").split("\r\n")[1:]:
        name, _, value = line.partition(":")
        if name.strip().lower() == "authorization":
            found = _CREDENTIAL.search(value)
            return found.group(1) if found else ""
    return ""


class RecordingProxy:
    """Forward every connection to ``upstream_host:upstream_port`` and count its requests."""

    def __init__(self, upstream_host: str, upstream_port: int) -> None:
        self._upstream = (upstream_host, upstream_port)
        self._counts: collections.Counter[str] = collections.Counter()
        self._user_agents: collections.Counter[str] = collections.Counter()
        self._signers: collections.Counter[tuple[str, str]] = collections.Counter()
        self._lock = threading.Lock()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="recording-proxy", daemon=True)
        self._server: asyncio.Server | None = None
        self.port = 0

    @property
    def endpoint_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def counts(self) -> collections.Counter[str]:
        """Requests per operation since the start or the last :meth:`reset` (a copy)."""
        with self._lock:
            return collections.Counter(self._counts)

    def signers(self) -> collections.Counter[tuple[str, str]]:
        """Requests per (operation, access key id that signed it), since the start or :meth:`reset`."""
        with self._lock:
            return collections.Counter(self._signers)

    def cpu_seconds(self) -> float:
        """CPU time the proxy's thread used (a benchmark subtracts it from its process's)."""
        if self._thread.ident is None:
            return 0.0
        return time.clock_gettime(time.pthread_getcpuclockid(self._thread.ident))

    def reset(self) -> None:
        with self._lock:
            self._counts.clear()
            self._signers.clear()

    def __enter__(self) -> Self:
        self._thread.start()
        self._server = asyncio.run_coroutine_threadsafe(
            asyncio.start_server(self._serve, "127.0.0.1", 0), self._loop
        ).result(10)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    def __exit__(self, *exc_info: object) -> None:
        async def close() -> None:
            assert self._server is not None
            self._server.close()
            for task in asyncio.all_tasks():
                if task is not asyncio.current_task():
                    task.cancel()

        asyncio.run_coroutine_threadsafe(close(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    async def _serve(self, client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        upstream_reader, upstream_writer = await asyncio.open_connection(*self._upstream)
        responses = asyncio.create_task(self._pump(upstream_reader, client_writer))
        try:
            while True:
                head = await client_reader.readuntil(b"\r\n\r\n")
                if len(head) > _MAX_HEAD:
                    break
                length = 0
                for line in head.split(b"\r\n"):
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":", 1)[1])
                body = await client_reader.readexactly(length) if length else b""
                operation = operation_of(head, body)
                with self._lock:
                    self._counts[operation] += 1
                    self._signers[operation, signer_of(head)] += 1
                upstream_writer.write(head + body)
                await upstream_writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.LimitOverrunError):
            pass
        finally:
            upstream_writer.close()
            with contextlib.suppress(Exception):
                await responses
            client_writer.close()

    @staticmethod
    async def _pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError, asyncio.CancelledError):
            while chunk := await reader.read(65536):
                writer.write(chunk)
                await writer.drain()
        writer.close()
