"""
A Kafka-protocol proxy on loopback, for the answers the brokers here never give (FIDELITY.md).

It forwards every request to one broker and every answer back, rewriting the broker's address
in Metadata and FindCoordinator answers to its own, so the client keeps talking through it. For
chosen groups it can answer OffsetFetch (v2+) the way a Kafka coordinator that is loading the
group's offsets does: a request-level ``COORDINATOR_LOAD_IN_PROGRESS`` and no partitions
(Kafka's ``OffsetFetchRequest.getErrorResponse``). The request still goes to the broker first,
so answers keep their order on the connection.

For chosen groups it can also answer OffsetCommit the way a coordinator that moved (or is loading)
does: ``NOT_COORDINATOR`` for every partition, the commit not applied (Kafka's
``GroupCoordinator.handleCommitOffsets`` validates the group's coordinator before it stores
anything). The request goes to the broker under another group id of the same length, so nothing
lands on the group's offsets and answers keep their order.
"""

from __future__ import annotations

import asyncio
import struct
from typing import Any

from aiokafka.protocol.commit import (
    OffsetCommitResponse_v0,
    OffsetCommitResponse_v1,
    OffsetCommitResponse_v2,
    OffsetCommitResponse_v3,
    OffsetFetchResponse_v2,
    OffsetFetchResponse_v3,
)
from aiokafka.protocol.coordination import FindCoordinatorResponse_v0, FindCoordinatorResponse_v1
from aiokafka.protocol.metadata import (
    MetadataResponse_v0,
    MetadataResponse_v1,
    MetadataResponse_v2,
    MetadataResponse_v3,
    MetadataResponse_v4,
    MetadataResponse_v5,
)

from tests.support.loopback_forwarder import LoopbackForwarder

METADATA, OFFSET_COMMIT, OFFSET_FETCH, FIND_COORDINATOR = 3, 8, 9, 10
COORDINATOR_LOAD_IN_PROGRESS, NOT_COORDINATOR = 14, 16
COMMIT_ANSWERS: dict[int, Any] = {
    r.API_VERSION: r
    for r in (
        OffsetCommitResponse_v0,
        OffsetCommitResponse_v1,
        OffsetCommitResponse_v2,
        OffsetCommitResponse_v3,
    )
}
METADATA_ANSWERS: dict[int, Any] = {
    r.API_VERSION: r
    for r in (
        MetadataResponse_v0,
        MetadataResponse_v1,
        MetadataResponse_v2,
        MetadataResponse_v3,
        MetadataResponse_v4,
        MetadataResponse_v5,
    )
}
COORDINATOR_ANSWERS: dict[int, Any] = {0: FindCoordinatorResponse_v0, 1: FindCoordinatorResponse_v1}


class KafkaProtocolProxy(LoopbackForwarder):
    """
    Forward ``127.0.0.1:port`` to the broker at ``127.0.0.1:target_port`` (one broker).

    ``loading[group] = n``: the next ``n`` OffsetFetch requests of ``group`` are answered with a
    request-level ``COORDINATOR_LOAD_IN_PROGRESS``; ``loading_answered`` counts them.

    ``moved[group] = n``: the next ``n`` OffsetCommit requests of ``group`` are not applied and are
    answered ``NOT_COORDINATOR`` for every partition; ``moved_answered`` counts them.

    :meth:`go_down` and :meth:`come_up`: an outage as a client sees a broker restart, every
    connection closed and new ones closed at once, until it comes up.
    """

    def __init__(self, target_port: int) -> None:
        super().__init__(target_port)
        self.loading: dict[str, int] = {}
        self.loading_answered = 0
        self.moved: dict[str, int] = {}
        self.moved_answered = 0
        self.down = False

    def go_down(self) -> None:
        """Close every connection, and each new one at once, until :meth:`come_up`."""
        self.down = True
        for task in list(self._tasks):
            task.cancel()

    def come_up(self) -> None:
        self.down = False

    async def _serve(self, client_in: asyncio.StreamReader, client_out: asyncio.StreamWriter) -> None:
        if self.down:
            client_out.close()
            return
        await super()._serve(client_in, client_out)

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    async def forward(
        self,
        client_in: asyncio.StreamReader,
        client_out: asyncio.StreamWriter,
        upstream_in: asyncio.StreamReader,
        upstream_out: asyncio.StreamWriter,
    ) -> None:
        asked: dict[int, tuple[int, int, str | None]] = {}
        await asyncio.gather(
            self._requests(client_in, upstream_out, asked), self._answers(upstream_in, client_out, asked)
        )

    async def _requests(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        asked: dict[int, tuple[int, int, str | None]],
    ) -> None:
        while True:
            frame = await _read_frame(reader)
            api_key, version, correlation = struct.unpack(">hhi", frame[:8])
            group = None
            if api_key in (OFFSET_FETCH, OFFSET_COMMIT):
                (client_len,) = struct.unpack(">h", frame[8:10])
                at = 10 + max(client_len, 0)
                (group_len,) = struct.unpack(">h", frame[at : at + 2])
                group = frame[at + 2 : at + 2 + group_len].decode()
                if api_key == OFFSET_COMMIT and self.moved.get(group, 0) > 0:
                    assert version in COMMIT_ANSWERS, f"OffsetCommit v{version}"
                    self.moved[group] -= 1
                    # Sent on under another group of the same length: not applied to this group.
                    other = b"~" * group_len
                    frame = frame[: at + 2] + other + frame[at + 2 + group_len :]
                    group = "\0moved"
            asked[correlation] = (api_key, version, group)
            writer.write(struct.pack(">i", len(frame)) + frame)
            await writer.drain()

    async def _answers(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        asked: dict[int, tuple[int, int, str | None]],
    ) -> None:
        while True:
            frame = await _read_frame(reader)
            (correlation,) = struct.unpack(">i", frame[:4])
            api_key, version, group = asked.pop(correlation, (-1, -1, None))
            body = self._rewrite(api_key, version, group, frame[4:])
            answer = frame[:4] + body
            writer.write(struct.pack(">i", len(answer)) + answer)
            await writer.drain()

    def _rewrite(self, api_key: int, version: int, group: str | None, body: bytes) -> bytes:
        if api_key == METADATA and version in METADATA_ANSWERS:
            answer = METADATA_ANSWERS[version].decode(body)
            answer.brokers = [(b[0], b[1], self.port, *b[3:]) for b in answer.brokers]
            return bytes(answer.encode())
        if api_key == FIND_COORDINATOR and version in COORDINATOR_ANSWERS:
            answer = COORDINATOR_ANSWERS[version].decode(body)
            answer.port = self.port
            return bytes(answer.encode())
        if api_key == OFFSET_COMMIT and group == "\0moved":
            self.moved_answered += 1
            answer = COMMIT_ANSWERS[version].decode(body)
            answer.topics = [(t, [(p[0], NOT_COORDINATOR) for p in parts]) for t, parts in answer.topics]
            return bytes(answer.encode())
        if api_key == OFFSET_FETCH and group is not None and self.loading.get(group, 0) > 0:
            assert version >= 2, f"OffsetFetch v{version} has no request-level error code"
            self.loading[group] -= 1
            self.loading_answered += 1
            if version == 2:
                return bytes(OffsetFetchResponse_v2([], COORDINATOR_LOAD_IN_PROGRESS).encode())
            return bytes(OffsetFetchResponse_v3(0, [], COORDINATOR_LOAD_IN_PROGRESS).encode())
        return body


async def _read_frame(reader: asyncio.StreamReader) -> bytes:
    (size,) = struct.unpack(">i", await reader.readexactly(4))
    return await reader.readexactly(size)
