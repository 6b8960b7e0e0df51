"""``SqsSharedStreamTrigger``: watch an SQS queue from any number of AssetWatchers, one poller."""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any

from airflow_shared_stream.common.errors import require_sdk
from airflow_shared_stream.common.trigger import (
    DEFAULT_MAX_IN_FLIGHT,
    DEFAULT_MAX_PAYLOAD_BYTES,
    SharedStreamTrigger,
)
from airflow_shared_stream.sqs.errors import SqsConfigurationError
from airflow_shared_stream.sqs.hook import QueueUrl, SqsSharedStreamHook

require_sdk("aiobotocore", "sqs")


class SqsSharedStreamTrigger(SharedStreamTrigger):
    """
    Fire an asset event for each SQS message this watcher's ``match`` selects, at least once.

    Every trigger on the same queue shares one long-polling receiver in the triggerer; each sees
    every message. The stream is the queue (its URL, normalised: ``sqs.<region>.amazonaws.com``
    and ``<region>.queue.amazonaws.com`` name the same queue), and nothing else: watchers that
    spell the region differently, or not at all, share the receiver. A message is deleted only
    after every watcher online when it arrived has moved past it and its asset events are
    persisted; a watcher that fails makes it come back; a ``reject`` sends it to the dead-letter
    queue. The trigger event payload is the message envelope::

        {"message_id": ..., "body": <JSON object, or text>, "attributes": {...},
         "message_attributes": {...}, "queue_url": ...}

    :param queue_url: the queue to watch (the stream's identity).
    :param aws_conn_id: ``aws`` connection with the credentials (``aws_default``).
    :param region_name: overrides the connection's ``extra.region_name`` and the queue URL's
        region. ``None`` means "as the connection / URL says".
    :param match: JMESPath over the envelope; truthy fires an event. ``None`` matches everything.
    :param reject: JMESPath over the envelope; truthy dead-letters the message.
    :param dead_letter_queue_url: where rejected messages go; defaults to the queue's
        RedrivePolicy target. Without either they stay on the queue (with a warning).
    :param max_in_flight: most messages received and not yet settled.
    :param max_payload_bytes: largest body turned into an event; larger ones are dead-lettered.
    :param wait_time_seconds: long-poll wait of each receive (1-20).

    ``aws_conn_id``, ``region_name``, ``dead_letter_queue_url``, ``max_in_flight``,
    ``max_payload_bytes`` and ``wait_time_seconds`` shape the one receiver: every watcher of a
    queue must give the same values (a watcher that disagrees fails at start, naming the
    argument). ``match`` and ``reject`` are each watcher's own.
    """

    broker = "sqs"
    identity_fields = ("queue_url",)
    shaping_fields = ("aws_conn_id", "region_name", "dead_letter_queue_url", "wait_time_seconds")
    connection_default_fields = frozenset({"region_name"})
    producer_path = "airflow_shared_stream.sqs.producer:SqsSharedStreamProducer"
    """The producer the triggerer builds for this trigger's stream (a subclass may swap it)."""

    def __init__(
        self,
        queue_url: str,
        *,
        aws_conn_id: str = SqsSharedStreamHook.default_conn_name,
        region_name: str | None = None,
        match: str | None = None,
        reject: str | None = None,
        dead_letter_queue_url: str | None = None,
        max_in_flight: int = DEFAULT_MAX_IN_FLIGHT,
        max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES,
        wait_time_seconds: int = 20,
    ) -> None:
        super().__init__(
            match=match, reject=reject, max_in_flight=max_in_flight, max_payload_bytes=max_payload_bytes
        )
        self._queue = QueueUrl.parse(queue_url)
        self._dead_letter_queue = QueueUrl.parse(dead_letter_queue_url) if dead_letter_queue_url else None
        if self._dead_letter_queue is not None and self._dead_letter_queue.identity == self._queue.identity:
            raise SqsConfigurationError("dead_letter_queue_url must differ from queue_url")
        if not isinstance(wait_time_seconds, int) or not 1 <= wait_time_seconds <= 20:
            raise SqsConfigurationError(
                f"wait_time_seconds must be an int from 1 to 20, got {wait_time_seconds!r}"
            )
        if not aws_conn_id:
            raise SqsConfigurationError("aws_conn_id must name an Airflow connection")
        self.queue_url = queue_url
        self.aws_conn_id = aws_conn_id
        self.region_name = region_name
        self.dead_letter_queue_url = dead_letter_queue_url
        self.wait_time_seconds = wait_time_seconds

    def metrics_stream_name(self) -> str:
        return self._queue.name

    def stream_identity(self) -> tuple[Hashable, ...]:
        return self._queue.identity

    def normalized_shape(self) -> dict[str, Any]:
        shape = super().normalized_shape()
        # A region in the queue's AWS host is the region; None defers to it (or the connection).
        shape["region_name"] = self.region_name or self._queue.region_in_host
        shape["dead_letter_queue_url"] = self._dead_letter_queue.identity if self._dead_letter_queue else None
        return shape
