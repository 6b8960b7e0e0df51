"""A loopback proxy that holds every request until a given number of them are in."""

from __future__ import annotations

import asyncio

from tests.support.loopback_forwarder import LoopbackForwarder


class GatheringForwarder(LoopbackForwarder):
    """
    Forward to ``target_port`` only once ``together`` clients have each sent their first bytes:
    requests sent one after another's answer are never answered (their client's own timeout
    ends them), requests in flight together all are.
    """

    def __init__(self, target_port: int, together: int) -> None:
        super().__init__(target_port)
        self.together = together
        self.arrived = 0
        self._all_in = asyncio.Event()

    async def forward(
        self,
        client_in: asyncio.StreamReader,
        client_out: asyncio.StreamWriter,
        upstream_in: asyncio.StreamReader,
        upstream_out: asyncio.StreamWriter,
    ) -> None:
        first = await client_in.read(65536)
        if not first:
            return
        self.arrived += 1
        if self.arrived >= self.together:
            self._all_in.set()
        await self._all_in.wait()
        upstream_out.write(first)
        pipes = [
            asyncio.create_task(_pipe(client_in, upstream_out)),
            asyncio.create_task(_pipe(upstream_in, client_out)),
        ]
        try:
            await asyncio.wait(pipes, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for pipe in pipes:
                pipe.cancel()


async def _pipe(source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
    while data := await source.read(65536):
        sink.write(data)
        await sink.drain()
