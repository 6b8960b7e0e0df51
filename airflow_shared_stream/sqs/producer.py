"""
The SQS half of a shared stream: one long-polling receiver per queue, on the leased-queue template.

========  ================================================================================
ACK       ``DeleteMessageBatch`` (10 per call)
REDELIVER ``ChangeMessageVisibilityBatch`` to 0: the message is visible again at once
DEAD      ``SendMessageBatch`` to the dead-letter queue (given, or the queue's RedrivePolicy
LETTER    target), then delete what SQS accepted (:mod:`.dead_letter`); without a dead-letter
          queue the message is left to the queue (it comes back after each visibility timeout)
========  ================================================================================

Dead-letter batches are bounded by count (10) and by the dead-letter queue's
``MaximumMessageSize``, which SQS also applies to a whole batch.

Lanes: a FIFO queue keeps order per ``MessageGroupId``, so each group is an ordered lane. A
standard queue has no order to keep; the messages of one receive call share an advance lane.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import logging
from collections.abc import Collection, Sequence
from typing import Any

from airflow_shared_stream.common import flow_control
from airflow_shared_stream.common.errors import SecretScrubber, require_sdk
from airflow_shared_stream.common.leased_queue import DeadLetter, Delivery, LeasedQueueProducer, chunked
from airflow_shared_stream.common.matching import build_message
from airflow_shared_stream.common.trigger import DEFAULT_MAX_PAYLOAD_BYTES
from airflow_shared_stream.sqs.dead_letter import (
    DEAD_LETTER_ORIGIN_QUEUE,
    SQS_BATCH_LIMIT,
    SQS_MAX_MESSAGE_BYTES,
    SqsMessageHandle,
    dead_letter_entry,
    entry_size,
)
from airflow_shared_stream.sqs.errors import SqsEndpointError, call_sqs
from airflow_shared_stream.sqs.hook import QueueUrl, open_queue_client

SQS_MAX_VISIBILITY_SECONDS = 12 * 60 * 60
"""The longest SQS keeps a received message invisible, counted from its receipt, renewals included."""

require_sdk("aiobotocore", "sqs")

log = logging.getLogger(__name__)

CLOSE_RELEASE_SECONDS = 5.0
"""How long closing the stream may spend giving unsettled messages back."""


class SqsSharedStreamProducer(LeasedQueueProducer[SqsMessageHandle]):
    """
    Receive from one SQS queue for every watcher that shares it, and settle per the table.

    Built by :meth:`SqsSharedStreamTrigger.create_shared_stream_producer` from the first
    watcher's arguments; connects only in :meth:`open_stream`.
    """

    broker = "sqs"
    sdk_modules = ("aiobotocore.session", "aiobotocore.config", "aiobotocore.credentials")
    receive_limit = SQS_BATCH_LIMIT
    settle_batch_limit = SQS_BATCH_LIMIT
    dead_letter_batch_limit = SQS_BATCH_LIMIT
    dead_letter_batch_bytes = SQS_MAX_MESSAGE_BYTES
    receives_take_given_back = True

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
        super().__init__(max_in_flight=max_in_flight, stream_label=self._queue.name)
        self._dead_letter_queue = QueueUrl.parse(dead_letter_queue_url) if dead_letter_queue_url else None
        self._aws_conn_id = aws_conn_id
        self._region_name = region_name
        self._wait_time_seconds = wait_time_seconds
        # A receive cancelled on close may still be handed messages by SQS: let it return first.
        self.receive_wait_on_close = wait_time_seconds + 1.0
        self._max_payload_bytes = max_payload_bytes
        self._dead_letter_max_bytes = SQS_MAX_MESSAGE_BYTES
        self._queue_arn: str | None = None
        self._exit_stack = contextlib.AsyncExitStack()
        self._client: Any = None
        self._scrubber = SecretScrubber()

    @property
    def queue(self) -> QueueUrl:
        return self._queue

    @property
    def dead_letter_queue(self) -> QueueUrl | None:
        return self._dead_letter_queue

    # -- connection ---------------------------------------------------------------------------

    async def connect(self) -> float:
        self._client = await self._exit_stack.enter_async_context(
            open_queue_client(
                aws_conn_id=self._aws_conn_id,
                region_name=self._region_name,
                queue=self._queue,
                wait_seconds=self._wait_time_seconds,
                scrubber=self._scrubber,
            )
        )
        attributes = await self._call("GetQueueAttributes", QueueUrl=self._queue.url, AttributeNames=["All"])
        queue_attributes = attributes.get("Attributes", {})
        if "QueueArn" not in queue_attributes:
            raise SqsEndpointError(
                f"GetQueueAttributes on {self._queue.url} returned no queue attributes: "
                "the endpoint did not answer as SQS"
            )
        self._queue_arn = queue_attributes["QueueArn"]
        if self._dead_letter_queue is None:
            self._dead_letter_queue = await self._redrive_target(queue_attributes)
        if self._dead_letter_queue is not None:
            dead_letter_attributes = await self._call(
                "GetQueueAttributes",
                queue=self._dead_letter_queue,
                QueueUrl=self._dead_letter_queue.url,
                AttributeNames=["MaximumMessageSize"],
            )
            self._dead_letter_max_bytes = int(
                dead_letter_attributes.get("Attributes", {}).get("MaximumMessageSize", SQS_MAX_MESSAGE_BYTES)
            )
            self.dead_letter_batch_bytes = self._dead_letter_max_bytes  # type: ignore[misc]
        log.info(
            "SQS shared stream open: queue=%s fifo=%s dead_letter_queue=%s max_in_flight=%d",
            self._queue.url,
            self._queue.is_fifo,
            self._dead_letter_queue.url if self._dead_letter_queue else None,
            self.credits.max_in_flight,
        )
        if self._dead_letter_queue is None:
            log.warning(
                "Queue %s has no dead_letter_queue_url and no RedrivePolicy: rejected messages "
                "stay on the queue and come back after each visibility timeout",
                self._queue.url,
            )
        return max(1, int(queue_attributes.get("VisibilityTimeout", 30)))

    def unseen_hold_limit(self, lease_seconds: float) -> float | None:
        """
        SQS keeps a message invisible for at most 12 hours from its receipt, renewals included
        (``ChangeMessageVisibility`` refuses more). A message reaches nobody at most the ack
        timeout after its receipt, and a renewal grants one visibility timeout ahead.
        """
        return SQS_MAX_VISIBILITY_SECONDS - flow_control.ack_timeout_seconds() - lease_seconds

    async def disconnect(self) -> None:
        await self._exit_stack.aclose()
        self._client = None

    async def _redrive_target(self, queue_attributes: dict[str, str]) -> QueueUrl | None:
        policy = queue_attributes.get("RedrivePolicy")
        if not policy:
            return None
        target_arn = json.loads(policy).get("deadLetterTargetArn", "")
        # arn:aws:sqs:<region>:<account>:<name>
        *_, account, name = target_arn.split(":")
        response = await self._call("GetQueueUrl", QueueName=name, QueueOwnerAWSAccountId=account)
        return QueueUrl.parse(response["QueueUrl"])

    # -- receiving ----------------------------------------------------------------------------

    async def receive(self, max_messages: int) -> Sequence[Delivery[SqsMessageHandle]]:
        response = await self._call(
            "ReceiveMessage",
            QueueUrl=self._queue.url,
            MaxNumberOfMessages=max_messages,
            WaitTimeSeconds=self._wait_time_seconds,
            MessageSystemAttributeNames=["All"],
            MessageAttributeNames=["All"],
        )
        return [self._delivery(message) for message in response.get("Messages", ())]

    def _delivery(self, message: dict[str, Any]) -> Delivery[SqsMessageHandle]:
        attributes = message.get("Attributes", {})
        group_id = attributes.get("MessageGroupId")
        body = message.get("Body", "")
        raw = build_message(
            body,
            metadata={
                "message_id": message["MessageId"],
                "attributes": attributes,
                "message_attributes": simplify_attributes(message.get("MessageAttributes", {})),
                "queue_url": self._queue.url,
            },
            label=f"{self._queue.name}/{message['MessageId']}",
            max_payload_bytes=self._max_payload_bytes,
        )
        handle = SqsMessageHandle(
            message_id=message["MessageId"],
            receipt_handle=message["ReceiptHandle"],
            body=body,
            message_attributes=message.get("MessageAttributes", {}),
            group_id=group_id,
        )
        return Delivery(
            message=raw,
            handle=handle,
            lease=handle.receipt_handle,
            lane=group_id if self._queue.is_fifo else None,
            size=len(body.encode("utf-8")),
            message_id=handle.message_id,
        )

    async def broker_lag(self) -> int | None:
        response = await self._call(
            "GetQueueAttributes", QueueUrl=self._queue.url, AttributeNames=["ApproximateNumberOfMessages"]
        )
        value = response.get("Attributes", {}).get("ApproximateNumberOfMessages")
        return int(value) if value is not None else None

    # -- settlement ---------------------------------------------------------------------------

    async def ack(self, deliveries: Sequence[Delivery[SqsMessageHandle]]) -> None:
        await self._delete([d.handle for d in deliveries])

    async def redeliver(self, deliveries: Sequence[Delivery[SqsMessageHandle]]) -> None:
        await self._change_visibility([d.handle for d in deliveries], 0)

    async def release_unsettled(self, deliveries: Sequence[Delivery[SqsMessageHandle]]) -> None:
        """
        On close, make what the stream still holds visible again at once (visibility 0).

        Else the next stream on the queue waits out each message's visibility timeout, which the
        lease keeper may have pushed out. The template sent the queued ACKs (deletes) first.
        """
        if self._client is None:
            return
        handles = [d.handle for d in deliveries]
        await asyncio.wait_for(
            asyncio.gather(
                *(self._change_visibility(chunk, 0) for chunk in chunked(handles, max_count=SQS_BATCH_LIMIT))
            ),
            timeout=CLOSE_RELEASE_SECONDS,
        )

    async def extend_leases(
        self, deliveries: Sequence[Delivery[SqsMessageHandle]], seconds: float
    ) -> Collection[Delivery[SqsMessageHandle]]:
        failed = await self._change_visibility([d.handle for d in deliveries], int(seconds))
        return [deliveries[i] for i in failed]

    async def _delete(self, handles: list[SqsMessageHandle]) -> None:
        if not handles:
            return
        response = await self._call(
            "DeleteMessageBatch",
            QueueUrl=self._queue.url,
            Entries=[{"Id": str(i), "ReceiptHandle": h.receipt_handle} for i, h in enumerate(handles)],
        )
        _log_failed("delete", response, handles, "it will be redelivered after its visibility timeout")

    async def _change_visibility(self, handles: list[SqsMessageHandle], seconds: int) -> list[int]:
        """Change the visibility of ``handles``; return the indexes SQS refused."""
        if not handles:
            return []
        response = await self._call(
            "ChangeMessageVisibilityBatch",
            QueueUrl=self._queue.url,
            Entries=[
                {"Id": str(i), "ReceiptHandle": h.receipt_handle, "VisibilityTimeout": seconds}
                for i, h in enumerate(handles)
            ],
        )
        _log_failed("change visibility of", response, handles, "its current visibility timeout applies")
        return [int(failure["Id"]) for failure in response.get("Failed", ())]

    def dead_letter_size(self, letter: DeadLetter[SqsMessageHandle]) -> int:
        return entry_size(self._dead_letter_entry(0, letter))

    async def dead_letter(self, letters: Sequence[DeadLetter[SqsMessageHandle]]) -> None:
        if self._dead_letter_queue is None:
            for letter in letters:
                log.warning(
                    "Rejected message %s on %s left to the queue (no dead-letter queue): %s",
                    letter.delivery.message_id,
                    self._queue.url,
                    letter.description,
                )
            return
        dead_letter_queue = self._dead_letter_queue
        entries = [self._dead_letter_entry(i, letter) for i, letter in enumerate(letters)]
        response = await self._call(
            "SendMessageBatch", queue=dead_letter_queue, QueueUrl=dead_letter_queue.url, Entries=entries
        )
        handles = [letter.delivery.handle for letter in letters]
        _log_failed(
            f"dead-letter to {dead_letter_queue.url}", response, handles, "it stays on the source queue"
        )
        failed = {entry["Id"] for entry in response.get("Failed", ())}
        for sent in response.get("Successful", ()):
            if DEAD_LETTER_ORIGIN_QUEUE not in entries[int(sent["Id"])].get("MessageAttributes", {}):
                # Only this line knows where it came from: a redrive leaves it (docs/redrive.rst).
                log.warning(
                    "Dead-lettered message %s of %s to %s as %s without its origin (its own message "
                    "attributes leave no room for %s): a redrive leaves it; move it back to %s by hand",
                    handles[int(sent["Id"])].message_id,
                    self._queue_arn or self._queue.url,
                    dead_letter_queue.name,
                    sent.get("MessageId"),
                    DEAD_LETTER_ORIGIN_QUEUE,
                    self._queue.url,
                )
        moved = [h for i, h in enumerate(handles) if str(i) not in failed]
        await self._delete(moved)
        if moved:
            log.info("Dead-lettered %d message(s) to %s", len(moved), dead_letter_queue.name)

    def _dead_letter_entry(self, index: int, letter: DeadLetter[SqsMessageHandle]) -> dict[str, Any]:
        return dead_letter_entry(
            index,
            letter,
            queue=self._dead_letter_queue,
            max_bytes=self._dead_letter_max_bytes,
            origin=self._queue_arn,
        )

    # -- errors -------------------------------------------------------------------------------

    async def _call(self, operation: str, *, queue: QueueUrl | None = None, **params: Any) -> dict[str, Any]:
        """
        Call one SQS operation, its botocore errors translated (:mod:`.errors`).

        ``queue`` is the queue the call is about (the source queue unless given): errors name it.
        """
        return await call_sqs(
            self._client,
            operation,
            queue_url=(queue or self._queue).url,
            aws_conn_id=self._aws_conn_id,
            scrub=self._scrubber.scrub,
            **params,
        )


def simplify_attributes(attributes: dict[str, Any]) -> dict[str, Any]:
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


def __getattr__(name: str) -> Any:
    if name == "ack_timeout_seconds":
        import warnings

        from airflow.exceptions import AirflowProviderDeprecationWarning

        from airflow_shared_stream.common.flow_control import ack_timeout_seconds

        warnings.warn(
            "airflow_shared_stream.sqs.producer.ack_timeout_seconds is deprecated; use "
            "airflow_shared_stream.common.flow_control.ack_timeout_seconds instead",
            AirflowProviderDeprecationWarning,
            stacklevel=2,
        )
        return ack_timeout_seconds
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
