"""A TCP forwarder on loopback that records what clients send, to check what goes on the wire."""

from __future__ import annotations

import asyncio
import contextlib


class RecordingTcpProxy:
    """
    Forward connections to ``127.0.0.1:target_port`` and keep every byte clients sent.

    For assertions a server cannot make for us: the noida-db broker accepts SASL/PLAIN without
    checking credentials, so whether the connection's password is the one sent is read here.
    Runs in the test's event loop; ``async with`` starts and stops it.
    """

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.sent = bytearray()
        self.port = 0
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    async def __aenter__(self) -> RecordingTcpProxy:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._server is not None:
            self._server.close()
        for task in list(self._tasks):
            task.cancel()
        for task in list(self._tasks):
            with contextlib.suppress(BaseException):
                await task

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        upstream_reader, upstream_writer = await asyncio.open_connection("127.0.0.1", self.target_port)
        try:
            await asyncio.gather(
                self._pipe(reader, upstream_writer, record=True),
                self._pipe(upstream_reader, writer, record=False),
                return_exceptions=True,
            )
        finally:
            self._tasks.discard(task)

    async def _pipe(self, source: asyncio.StreamReader, sink: asyncio.StreamWriter, *, record: bool) -> None:
        try:
            while data := await source.read(65536):
                if record:
                    self.sent.extend(data)
                sink.write(data)
                await sink.drain()
        finally:
            sink.close()
