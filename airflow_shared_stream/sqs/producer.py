"""
The SQS half of a shared stream: one long-polling receiver per queue, settled per the table.

========  ================================================================================
ACK       ``DeleteMessageBatch`` (10 per call)
REDELIVER ``ChangeMessageVisibilityBatch`` to 0: the message is visible again at once
DEAD      ``SendMessageBatch`` to the dead-letter queue (given, or the queue's RedrivePolicy
LETTER    target), then delete; without a dead-letter queue the message is left to the queue
========  ================================================================================

While a message waits for its trigger events to be persisted, its visibility timeout is
extended (:class:`~airflow_shared_stream.common.leases.LeaseKeeper`), so SQS does not hand it
out again while it is still outstanding.

Lanes: a FIFO queue keeps order per ``MessageGroupId``, so each group is a lane. A standard
queue has no order to keep; each receive call (up to 10 messages) is a lane, which makes every
settlement one batch call while limiting head-of-line blocking to the messages received
together (bench/sqs_lanes.py compares this with one global lane and a lane per message).
"""

from __future__ import annotations

import base64
import contextlib
import itertools
import json
import logging
from collections.abc import AsyncIterator, Hashable, Sequence
from dataclasses import dataclass
from typing import Any

from airflow.triggers.shared_stream import AdvanceItem, SharedStreamProducer

from airflow_shared_stream.common.flow_control import CreditWindow, yield_point
from airflow_shared_stream.common.leases import LeaseKeeper
from airflow_shared_stream.common.matching import RawMessage, decode_body
from airflow_shared_stream.common.settlement import Settlement, describe_batch, split_by_settlement
from airflow_shared_stream.common.trigger import DEFAULT_MAX_PAYLOAD_BYTES
from airflow_shared_stream.sqs.errors import (
    SqsAccessError,
    SqsEndpointError,
    SqsQueueNotFoundError,
    SqsSharedStreamError,
)
from airflow_shared_stream.sqs.hook import QueueUrl, SqsHook

log = logging.getLogger(__name__)

SQS_BATCH_LIMIT = 10
"""Most entries SQS accepts in one receive, delete, visibility or send batch call."""

_MISSING_QUEUE_CODES = frozenset(
    {"AWS.SimpleQueueService.NonExistentQueue", "QueueDoesNotExist", "NonExistentQueue"}
)
_ACCESS_CODES = frozenset(
    {
        "AccessDenied",
        "AccessDeniedException",
        "ExpiredToken",
        "InvalidAccessKeyId",
        "InvalidClientTokenId",
        "InvalidSecurity",
        "MissingAuthenticationToken",
        "SignatureDoesNotMatch",
        "UnrecognizedClientException",
    }
)


@dataclass(frozen=True, slots=True)
class SqsMessageHandle:
    """What :meth:`SqsSharedStreamProducer.advance` needs to settle one received message."""

    message_id: str
    receipt_handle: str
    body: str
    message_attributes: dict[str, Any]
    group_id: str | None
    lane: Hashable


def ack_timeout_seconds() -> float:
    """The triggerer's per-event ack timeout: the longest a lease is worth extending."""
    from airflow.configuration import conf

    return conf.getfloat("triggerer", "shared_stream_ack_timeout", fallback=300.0)


class SqsSharedStreamProducer(SharedStreamProducer):
    """
    Receive from one SQS queue for every watcher that shares it, and settle per the table.

    Built by :meth:`SqsSharedStreamTrigger.create_shared_stream_producer` from the first
    watcher's arguments; connects only in :meth:`open_stream`.
    """

    def __init__(
        self,
        *,
        queue_url: str,
        aws_conn_id: str,
        region_name: str | None,
        dead_letter_queue_url: str | None,
        max_in_flight: int,
        wait_time_seconds: int = 20,
        max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES,
    ) -> None:
        self._queue = QueueUrl.parse(queue_url)
        self._dead_letter_queue = QueueUrl.parse(dead_letter_queue_url) if dead_letter_queue_url else None
        self._aws_conn_id = aws_conn_id
        self._region_name = region_name
        self._wait_time_seconds = wait_time_seconds
        self._max_payload_bytes = max_payload_bytes
        self._window = CreditWindow(max_in_flight)
        self._exit_stack = contextlib.AsyncExitStack()
        self._client: Any = None
        self._leases: LeaseKeeper[str] | None = None
        self._receive_batches = itertools.count()

    # -- stream -------------------------------------------------------------------------------

    async def open_stream(self) -> AsyncIterator[tuple[RawMessage, SqsMessageHandle]]:
        await self._connect()
        attributes = await self._call("GetQueueAttributes", QueueUrl=self._queue.url, AttributeNames=["All"])
        queue_attributes = attributes.get("Attributes", {})
        if "QueueArn" not in queue_attributes:
            raise SqsEndpointError(
                f"GetQueueAttributes on {self._queue.url} returned no queue attributes: "
                "the endpoint did not answer as SQS"
            )
        if self._dead_letter_queue is None:
            self._dead_letter_queue = await self._redrive_target(queue_attributes)
        visibility = max(1, int(queue_attributes.get("VisibilityTimeout", 30)))
        self._leases = LeaseKeeper(
            self._extend_visibility, lease_seconds=visibility, max_hold_seconds=ack_timeout_seconds()
        )
        self._leases.start()
        log.info(
            "SQS shared stream open: queue=%s fifo=%s dead_letter_queue=%s max_in_flight=%d",
            self._queue.url,
            self._queue.is_fifo,
            self._dead_letter_queue.url if self._dead_letter_queue else None,
            self._window.max_in_flight,
        )
        if self._dead_letter_queue is None:
            log.warning(
                "Queue %s has no dead_letter_queue_url and no RedrivePolicy: rejected messages "
                "stay on the queue and come back after each visibility timeout",
                self._queue.url,
            )
        while True:
            credits = await self._window.wait_for_credit()
            response = await self._call(
                "ReceiveMessage",
                QueueUrl=self._queue.url,
                MaxNumberOfMessages=min(SQS_BATCH_LIMIT, credits),
                WaitTimeSeconds=self._wait_time_seconds,
                MessageSystemAttributeNames=["All"],
                MessageAttributeNames=["All"],
            )
            batch_lane = next(self._receive_batches)
            for message in response.get("Messages", ()):
                raw, handle = self._to_event(message, batch_lane)
                self._window.take()
                self._leases.hold(handle.receipt_handle)
                yield raw, handle
                await yield_point()

    def get_advance_lane(self, broker_payload: SqsMessageHandle) -> Hashable:
        return broker_payload.lane

    def _to_event(self, message: dict[str, Any], batch_lane: int) -> tuple[RawMessage, SqsMessageHandle]:
        attributes = message.get("Attributes", {})
        group_id = attributes.get("MessageGroupId")
        raw_body = message.get("Body", "")
        body, unprocessable = decode_body(raw_body)
        size = len(raw_body.encode("utf-8"))
        if size > self._max_payload_bytes:
            body = None
            unprocessable = f"body of {size} bytes exceeds the {self._max_payload_bytes}-byte payload limit"
        envelope = {
            "message_id": message["MessageId"],
            "body": body,
            "attributes": attributes,
            "message_attributes": _simplify_attributes(message.get("MessageAttributes", {})),
            "queue_url": self._queue.url,
        }
        handle = SqsMessageHandle(
            message_id=message["MessageId"],
            receipt_handle=message["ReceiptHandle"],
            body=raw_body,
            message_attributes=message.get("MessageAttributes", {}),
            group_id=group_id,
            lane=("group", group_id) if self._queue.is_fifo else ("receive", batch_lane),
        )
        label = f"{self._queue.name}/{message['MessageId']}"
        return RawMessage(envelope=envelope, label=label, unprocessable=unprocessable), handle

    # -- settlement ---------------------------------------------------------------------------

    async def advance(self, batch: Sequence[AdvanceItem]) -> None:
        settle = split_by_settlement(batch)
        assert self._leases is not None
        try:
            async with self._leases.settling(item.broker_payload.receipt_handle for item in batch):
                await self._delete(settle[Settlement.ACK])
                await self._make_visible(settle[Settlement.REDELIVER])
                await self._dead_letter(settle[Settlement.DEAD_LETTER])
        finally:
            self._window.release(len(batch))
        log.debug("SQS advance on %s: %s", self._queue.name, describe_batch(batch))

    async def _delete(self, handles: list[SqsMessageHandle], queue_url: str | None = None) -> None:
        for chunk in _chunks(handles):
            response = await self._call(
                "DeleteMessageBatch",
                QueueUrl=queue_url or self._queue.url,
                Entries=[{"Id": str(i), "ReceiptHandle": h.receipt_handle} for i, h in enumerate(chunk)],
            )
            _log_failed("delete", response, chunk, "it will be redelivered after its visibility timeout")

    async def _make_visible(self, handles: list[SqsMessageHandle]) -> None:
        await self._change_visibility([h.receipt_handle for h in handles], 0)

    async def _extend_visibility(self, receipt_handles: list[str], seconds: float) -> None:
        await self._change_visibility(receipt_handles, int(seconds))

    async def _change_visibility(self, receipt_handles: list[str], seconds: int) -> None:
        for chunk in _chunks(receipt_handles):
            response = await self._call(
                "ChangeMessageVisibilityBatch",
                QueueUrl=self._queue.url,
                Entries=[
                    {"Id": str(i), "ReceiptHandle": receipt, "VisibilityTimeout": seconds}
                    for i, receipt in enumerate(chunk)
                ],
            )
            _log_failed("change visibility of", response, chunk, "its current visibility timeout applies")

    async def _dead_letter(self, handles: list[SqsMessageHandle]) -> None:
        if not handles:
            return
        if self._dead_letter_queue is None:
            log.warning(
                "%d rejected message(s) on %s left to the queue (no dead-letter queue): %s",
                len(handles),
                self._queue.url,
                ", ".join(h.message_id for h in handles),
            )
            return
        dead_letter_queue = self._dead_letter_queue
        for chunk in _chunks(handles):
            entries = []
            for i, handle in enumerate(chunk):
                entry: dict[str, Any] = {"Id": str(i), "MessageBody": handle.body}
                if handle.message_attributes:
                    entry["MessageAttributes"] = _sendable_attributes(handle.message_attributes)
                if dead_letter_queue.is_fifo:
                    entry["MessageGroupId"] = handle.group_id or handle.message_id
                    entry["MessageDeduplicationId"] = handle.message_id
                entries.append(entry)
            response = await self._call("SendMessageBatch", QueueUrl=dead_letter_queue.url, Entries=entries)
            _log_failed("dead-letter", response, chunk, "it stays on the source queue")
            failed = {entry["Id"] for entry in response.get("Failed", ())}
            moved = [h for i, h in enumerate(chunk) if str(i) not in failed]
            await self._delete(moved)
            log.info("Dead-lettered %d message(s) to %s", len(moved), dead_letter_queue.name)

    # -- connection ---------------------------------------------------------------------------

    async def _connect(self) -> None:
        from aiobotocore.config import AioConfig
        from aiobotocore.session import get_session

        config = await SqsHook(self._aws_conn_id).aget_client_config(
            region_name=self._region_name, queue=self._queue
        )
        client_config = AioConfig(
            connect_timeout=10,
            read_timeout=self._wait_time_seconds + 15,
            retries={"mode": "standard", "max_attempts": 5},
        )
        self._client = await self._exit_stack.enter_async_context(
            get_session().create_client("sqs", config=client_config, **config.client_kwargs())
        )

    async def _redrive_target(self, queue_attributes: dict[str, str]) -> QueueUrl | None:
        policy = queue_attributes.get("RedrivePolicy")
        if not policy:
            return None
        target_arn = json.loads(policy).get("deadLetterTargetArn", "")
        # arn:aws:sqs:<region>:<account>:<name>
        *_, account, name = target_arn.split(":")
        response = await self._call("GetQueueUrl", QueueName=name, QueueOwnerAWSAccountId=account)
        return QueueUrl.parse(response["QueueUrl"])

    async def _call(self, operation: str, **params: Any) -> dict[str, Any]:
        """Call one SQS operation, turning botocore's errors into ones that name the problem."""
        from botocore.exceptions import BotoCoreError, ClientError

        method = getattr(self._client, _snake(operation))
        try:
            return await method(**params)
        except ClientError as exc:
            raise self._explain(operation, exc) from None
        except BotoCoreError as exc:
            raise SqsEndpointError(
                f"SQS {operation} on {self._queue.url} failed: the endpoint did not answer as SQS "
                f"({type(exc).__name__})"
            ) from None

    def _explain(self, operation: str, exc: Exception) -> SqsSharedStreamError:
        response = getattr(exc, "response", {})
        error = response.get("Error", {})
        code = error.get("Code", "Unknown")
        status = response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        if code in _MISSING_QUEUE_CODES:
            return SqsQueueNotFoundError(
                f"SQS queue {self._queue.url} does not exist, or connection {self._aws_conn_id!r} "
                "cannot see it"
            )
        if code in _ACCESS_CODES or status in (401, 403):
            # The service's own message can quote the signed request: leave it out.
            return SqsAccessError(
                f"SQS refused connection {self._aws_conn_id!r} on {operation} for {self._queue.url} ({code})"
            )
        return SqsSharedStreamError(
            f"SQS {operation} on {self._queue.url} failed: {code}: {error.get('Message', '')}"
        )

    async def aclose(self) -> None:
        if self._leases is not None:
            await self._leases.stop()
        await self._exit_stack.aclose()
        self._client = None


def _chunks(items: list[Any]) -> list[list[Any]]:
    return [items[i : i + SQS_BATCH_LIMIT] for i in range(0, len(items), SQS_BATCH_LIMIT)]


def _snake(operation: str) -> str:
    return "".join(f"_{c.lower()}" if c.isupper() else c for c in operation).lstrip("_")


def _simplify_attributes(attributes: dict[str, Any]) -> dict[str, Any]:
    """Message attributes as plain values for matching: text, numbers, or base64 for binary."""
    simple: dict[str, Any] = {}
    for name, attribute in attributes.items():
        data_type = attribute.get("DataType", "String")
        if "BinaryValue" in attribute:
            simple[name] = base64.b64encode(attribute["BinaryValue"]).decode("ascii")
        elif data_type.startswith("Number"):
            text = attribute.get("StringValue", "")
            try:
                simple[name] = int(text)
            except ValueError:
                try:
                    simple[name] = float(text)
                except ValueError:
                    simple[name] = text
        else:
            simple[name] = attribute.get("StringValue")
    return simple


def _sendable_attributes(attributes: dict[str, Any]) -> dict[str, Any]:
    """Received message attributes in the shape SendMessage accepts (no empty list fields)."""
    return {
        name: {k: v for k, v in attribute.items() if k in ("DataType", "StringValue", "BinaryValue")}
        for name, attribute in attributes.items()
    }


def _log_failed(action: str, response: dict[str, Any], chunk: Sequence[Any], consequence: str) -> None:
    for failure in response.get("Failed", ()):
        item = chunk[int(failure["Id"])]
        message_id = getattr(item, "message_id", "(lease)")
        log.warning(
            "Could not %s SQS message %s (%s: %s); %s",
            action,
            message_id,
            failure.get("Code"),
            failure.get("Message"),
            consequence,
        )
