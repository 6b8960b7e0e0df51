"""A TCP forwarder on loopback that records what clients send, to check what goes on the wire."""

from __future__ import annotations

import asyncio

from tests.support.loopback_forwarder import LoopbackForwarder


class RecordingTcpProxy(LoopbackForwarder):
    """
    Forward connections to ``127.0.0.1:target_port`` and keep every byte clients sent.

    For assertions a server cannot make for us: the noida-db broker accepts SASL/PLAIN without
    checking credentials, so whether the connection's password is the one sent is read here.
    Runs in the test's event loop; ``async with`` starts and stops it.
    """

    def __init__(self, target_port: int) -> None:
        super().__init__(target_port)
        self.sent = bytearray()

    async def forward(
        self,
        client_in: asyncio.StreamReader,
        client_out: asyncio.StreamWriter,
        upstream_in: asyncio.StreamReader,
        upstream_out: asyncio.StreamWriter,
    ) -> None:
        await asyncio.gather(
            self._pipe(client_in, upstream_out, record=True),
            self._pipe(upstream_in, client_out, record=False),
            return_exceptions=True,
        )

    async def _pipe(self, source: asyncio.StreamReader, sink: asyncio.StreamWriter, *, record: bool) -> None:
        try:
            while data := await source.read(65536):
                if record:
                    self.sent.extend(data)
                sink.write(data)
                await sink.drain()
        finally:
            sink.close()
