"""The lifecycle both loopback proxies share: listen, open one upstream per client, stop cleanly."""

from __future__ import annotations

import asyncio
import contextlib

from typing_extensions import Self


class LoopbackForwarder:
    """
    Accept clients on ``127.0.0.1:port`` and hand each, with its own connection to
    ``127.0.0.1:target_port``, to :meth:`forward`; ``async with`` starts and stops it.

    Runs in the test's event loop. Subclasses say what happens to the bytes in between.
    """

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.port = 0
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    async def __aenter__(self) -> Self:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
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

    async def _serve(self, client_in: asyncio.StreamReader, client_out: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        upstream_in, upstream_out = await asyncio.open_connection("127.0.0.1", self.target_port)
        try:
            await self.forward(client_in, client_out, upstream_in, upstream_out)
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            self._tasks.discard(task)
            for writer in (client_out, upstream_out):
                writer.close()

    async def forward(
        self,
        client_in: asyncio.StreamReader,
        client_out: asyncio.StreamWriter,
        upstream_in: asyncio.StreamReader,
        upstream_out: asyncio.StreamWriter,
    ) -> None:
        """Carry one client's connection until either side closes it."""
        raise NotImplementedError
