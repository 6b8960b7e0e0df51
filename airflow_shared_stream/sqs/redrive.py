"""
Redrive from an SQS dead-letter queue to its source queue (the protocol of common/redrive.py).

Each message is sent to the source queue with its body and message attributes (``SendMessageBatch``)
and deleted from the dead-letter queue only for the entries SQS accepted. On a FIFO source queue
the copy keeps the original's ``MessageGroupId``, and its ``MessageDeduplicationId`` is the
dead-letter message's id: a copy sent again after a redrive was killed before its delete is
dropped by SQS's deduplication window instead of being delivered twice, if sent within five
minutes of the first copy (later, it is a duplicate, as on a standard queue).

Where a message goes (the origin rule, docs/redrive.rst): a message SQS moved itself (its
``RedrivePolicy``, after ``maxReceiveCount``) carries the system attribute
``DeadLetterQueueSourceArn``, which SQS writes and no sender can: that is its origin, and its
``dead_letter_*`` message attributes are its own, never ours (they do not route it, and its
copy keeps them, as it was in the queue it goes back to). Any other message was sent to
the dead-letter queue: our dead-lettering stamps each copy with its source queue's ARN
(``dead_letter_origin_queue``, the message's own dropped). A message whose origin is another
queue is left untouched, and so is one with no origin at all (ours without room for the stamp,
or anyone else's: that one queue redrives to the dead-letter queue says nothing about who sent
it). A truncated copy of ours (``dead_letter_truncated_from``) is never sent as if it were the
original: it is left, and the log says so.

The copies are sent in batches of at most ten entries and :data:`SQS_MAX_MESSAGE_BYTES` (what SQS
accepts in one ``SendMessageBatch`` on every queue): a batch SQS refuses whole for its size would
be refused again on every attempt.

Messages are received with the redrive's own visibility timeout (``lease_seconds``), renewed
(``ChangeMessageVisibilityBatch``) while the redrive holds them; one that comes back anyway is
recognised by its id. The snapshot is the queue's ``ApproximateNumberOfMessages`` when the
redrive starts: it examines no more, so copies dead-lettered again while it runs are not chased.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Sequence
from typing import Any

from airflow_shared_stream.common.delivery import chunked
from airflow_shared_stream.common.errors import SecretScrubber
from airflow_shared_stream.common.matching import build_message
from airflow_shared_stream.common.redrive import RedriveItem, RedriveRoute, RedriveSnapshot
from airflow_shared_stream.common.trigger import DEFAULT_MAX_PAYLOAD_BYTES
from airflow_shared_stream.sqs.dead_letter import (
    DEAD_LETTER_DESCRIPTION,
    DEAD_LETTER_ORIGIN_QUEUE,
    DEAD_LETTER_REASON,
    DEAD_LETTER_TRUNCATED_FROM,
    SQS_BATCH_LIMIT,
    SQS_MAX_MESSAGE_BYTES,
    entry_size,
    sendable_attributes,
)
from airflow_shared_stream.sqs.errors import (
    SqsConfigurationError,
    SqsSharedStreamError,
    call_sqs,
)
from airflow_shared_stream.sqs.hook import QueueUrl, SqsSharedStreamHook, open_queue_client
from airflow_shared_stream.sqs.producer import simplify_attributes

log = logging.getLogger(__name__)

DEAD_LETTER_QUEUE_SOURCE_ARN = "DeadLetterQueueSourceArn"
"""What SQS writes on a message its ``RedrivePolicy`` moved: the source queue's ARN (unforgeable)."""

ORIGIN_ATTRIBUTES = (
    DEAD_LETTER_REASON,
    DEAD_LETTER_DESCRIPTION,
    DEAD_LETTER_TRUNCATED_FROM,
    DEAD_LETTER_ORIGIN_QUEUE,
)
"""The message attributes our dead-lettering adds (stripped unless ``keep_origin_attributes``)."""


class SqsDeadLetterSource:
    """
    Read an SQS dead-letter queue; copy to ``source_queue_url``; delete what SQS accepted.

    :param dead_letter: the dead-letter queue's URL.
    :param source: the source queue's URL (where the messages go back to).
    """

    broker = "sqs"

    def __init__(
        self,
        *,
        dead_letter: str,
        source: str | None,
        conn_id: str | None = None,
        keep_origin_attributes: bool = False,
        region_name: str | None = None,
        lease_seconds: int = 60,
        wait_seconds: int = 1,
    ) -> None:
        if not source:
            raise SqsConfigurationError("an SQS redrive needs the source queue's URL (source=...)")
        self._dead_letter = QueueUrl.parse(dead_letter)
        self._source = QueueUrl.parse(source)
        self._conn_id = conn_id or SqsSharedStreamHook.default_conn_name
        self._keep = keep_origin_attributes
        self._region_name = region_name
        self.lease_seconds = lease_seconds
        self._wait_seconds = wait_seconds
        self._client: Any = None
        self._source_arn: str | None = None
        self._exit_stack = contextlib.AsyncExitStack()
        self._scrubber = SecretScrubber()
        self.label = self._dead_letter.name

    @property
    def route(self) -> RedriveRoute:
        return RedriveRoute("queue", read_from=self._dead_letter.identity, write_to=self._source.identity)

    async def open(self) -> None:
        self._client = await self._exit_stack.enter_async_context(
            open_queue_client(
                aws_conn_id=self._conn_id,
                region_name=self._region_name,
                queue=self._dead_letter,
                wait_seconds=self._wait_seconds,
                scrubber=self._scrubber,
            )
        )
        for queue in (self._dead_letter, self._source):
            attributes = await self._call(
                "GetQueueAttributes", queue, QueueUrl=queue.url, AttributeNames=["QueueArn"]
            )
        self._source_arn = attributes.get("Attributes", {}).get("QueueArn")

    async def close(self) -> None:
        await self._exit_stack.aclose()
        self._client = None

    async def snapshot(self) -> RedriveSnapshot:
        """The visible messages now (approximate, as SQS counts): more are never examined."""
        response = await self._call(
            "GetQueueAttributes",
            self._dead_letter,
            QueueUrl=self._dead_letter.url,
            AttributeNames=["ApproximateNumberOfMessages"],
        )
        depth = int(response.get("Attributes", {}).get("ApproximateNumberOfMessages", 0))
        return RedriveSnapshot(depth=depth, bound=f"{depth} message(s) of {self._dead_letter.name}")

    async def read(self, limit: int) -> Sequence[RedriveItem]:
        response = await self._call(
            "ReceiveMessage",
            self._dead_letter,
            QueueUrl=self._dead_letter.url,
            MaxNumberOfMessages=max(1, min(limit, SQS_BATCH_LIMIT)),
            WaitTimeSeconds=self._wait_seconds,
            VisibilityTimeout=self.lease_seconds,
            MessageSystemAttributeNames=["All"],
            MessageAttributeNames=["All"],
        )
        return [self._item(message) for message in response.get("Messages", ())]

    def _item(self, message: dict[str, Any]) -> RedriveItem:
        envelope = build_message(
            message.get("Body", ""),
            metadata={
                "message_id": message["MessageId"],
                "attributes": message.get("Attributes", {}),
                "message_attributes": simplify_attributes(message.get("MessageAttributes", {})),
                "queue_url": self._dead_letter.url,
            },
            label=f"{self._dead_letter.name}/{message['MessageId']}",
            max_payload_bytes=DEFAULT_MAX_PAYLOAD_BYTES,
        ).envelope
        return RedriveItem(
            key=message["MessageId"], envelope=envelope, handle=message, leave=self._leave(message)
        )

    def _leave(self, message: dict[str, Any]) -> str | None:
        """Why this message must not go to the source queue (the module docstring's rule), or None."""
        moved_from = message.get("Attributes", {}).get(DEAD_LETTER_QUEUE_SOURCE_ARN)
        if moved_from is not None:  # SQS moved it: its own origin, whatever attributes it carries
            if moved_from == self._source_arn:
                return None
            return f"moved here by SQS from another queue ({moved_from}): redrive it to that queue"
        attributes = message.get("MessageAttributes", {})
        truncated = attributes.get(DEAD_LETTER_TRUNCATED_FROM, {}).get("StringValue")
        if truncated is not None:
            return (
                f"a truncated copy: its body was cut from {truncated} bytes when it was dead-lettered, "
                "and the original is gone from the source queue; recover the message from its "
                "producer, or move this copy by hand knowing it is cut"
            )
        origin = attributes.get(DEAD_LETTER_ORIGIN_QUEUE, {}).get("StringValue")
        if origin is not None:
            if origin == self._source_arn:
                return None
            return f"dead-lettered from another queue ({origin}): redrive it to that queue"
        return (
            "no origin recorded: SQS did not move it here (no DeadLetterQueueSourceArn) and our "
            "dead-lettering had no room to stamp it (or did not send it), so which queue it came "
            "from is not known; if ours, the stream's warning 'Dead-lettered message ... without "
            "its origin' names this message id and its queue: move it there by hand"
        )

    async def copy(self, items: Sequence[RedriveItem]) -> Sequence[RedriveItem]:
        entries = [self._entry(str(i), item.handle) for i, item in enumerate(items)]
        accepted: set[str] = set()
        for batch in chunked(
            entries, max_count=SQS_BATCH_LIMIT, max_bytes=SQS_MAX_MESSAGE_BYTES, size=entry_size
        ):
            try:
                response = await self._call(
                    "SendMessageBatch", self._source, QueueUrl=self._source.url, Entries=batch
                )
            except SqsSharedStreamError as exc:
                if not accepted:
                    raise
                # Copies already accepted must still leave the dead-letter queue: stop here.
                log.warning("SQS refused %d copy(ies) to %s: %s", len(batch), self._source.name, exc)
                break
            for failure in response.get("Failed", ()):
                log.warning(
                    "SQS refused the copy of %s to %s (%s): it stays in the dead-letter queue",
                    items[int(failure["Id"])].key,
                    self._source.name,
                    failure.get("Code"),
                )
            accepted.update(entry["Id"] for entry in response.get("Successful", ()))
        return [item for i, item in enumerate(items) if str(i) in accepted]

    def _entry(self, entry_id: str, message: dict[str, Any]) -> dict[str, Any]:
        attributes = sendable_attributes(message.get("MessageAttributes", {}))
        # What SQS moved carries none of ours: its dead_letter_* attributes are its own as it was
        # in the queue it goes back to (a sender's, or our stamp for the next hop of a chain).
        moved_by_sqs = DEAD_LETTER_QUEUE_SOURCE_ARN in message.get("Attributes", {})
        if not self._keep and not moved_by_sqs:
            attributes = {k: v for k, v in attributes.items() if k not in ORIGIN_ATTRIBUTES}
        entry: dict[str, Any] = {"Id": entry_id, "MessageBody": message.get("Body", "")}
        if attributes:
            entry["MessageAttributes"] = attributes
        if self._source.is_fifo:
            system = message.get("Attributes", {})
            entry["MessageGroupId"] = system.get("MessageGroupId") or message["MessageId"]
            entry["MessageDeduplicationId"] = message["MessageId"]
        return entry

    async def remove(self, moved: Sequence[RedriveItem], skipped: Sequence[RedriveItem]) -> None:
        if not moved:
            return
        entries = [
            {"Id": str(i), "ReceiptHandle": item.handle["ReceiptHandle"]} for i, item in enumerate(moved)
        ]
        response = await self._call(
            "DeleteMessageBatch", self._dead_letter, QueueUrl=self._dead_letter.url, Entries=entries
        )
        for failure in response.get("Failed", ()):
            log.warning(
                "Could not delete %s from %s after its copy (%s): it will be redriven again",
                moved[int(failure["Id"])].key,
                self._dead_letter.name,
                failure.get("Code"),
            )

    def held_handle(self, item: RedriveItem) -> Any:
        return {"ReceiptHandle": item.handle["ReceiptHandle"]}

    async def renew(self, items: Sequence[RedriveItem]) -> None:
        await self._hide_for(items, self.lease_seconds, "keep hidden")

    async def release(self, items: Sequence[RedriveItem]) -> None:
        await self._hide_for(items, 0, "give back")

    async def _hide_for(self, items: Sequence[RedriveItem], seconds: int, what: str) -> None:
        for start in range(0, len(items), SQS_BATCH_LIMIT):
            chunk = items[start : start + SQS_BATCH_LIMIT]
            entries = [
                {"Id": str(i), "ReceiptHandle": item.handle["ReceiptHandle"], "VisibilityTimeout": seconds}
                for i, item in enumerate(chunk)
            ]
            try:
                await self._call(
                    "ChangeMessageVisibilityBatch",
                    self._dead_letter,
                    QueueUrl=self._dead_letter.url,
                    Entries=entries,
                )
            except SqsSharedStreamError as exc:  # they come back when their lease ends anyway
                log.warning(
                    "Could not %s %d message(s) of %s: %s", what, len(chunk), self._dead_letter.name, exc
                )

    async def _call(self, operation: str, queue: QueueUrl, **params: Any) -> dict[str, Any]:
        return await call_sqs(
            self._client,
            operation,
            queue_url=queue.url,
            aws_conn_id=self._conn_id,
            scrub=self._scrubber.scrub,
            **params,
        )


def dead_letter_source(**kwargs: Any) -> SqsDeadLetterSource:
    return SqsDeadLetterSource(**kwargs)
