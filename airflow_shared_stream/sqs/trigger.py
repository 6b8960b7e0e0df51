"""``SqsSharedStreamTrigger``: watch an SQS queue from any number of AssetWatchers, one poller."""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any

from airflow_shared_stream.common.trigger import DEFAULT_MAX_IN_FLIGHT, SharedStreamTrigger
from airflow_shared_stream.sqs.errors import SqsConfigurationError
from airflow_shared_stream.sqs.hook import QueueUrl, SqsHook
from airflow_shared_stream.sqs.producer import SqsSharedStreamProducer


class SqsSharedStreamTrigger(SharedStreamTrigger):
    """
    Fire an asset event for each SQS message this watcher's ``match`` selects, at least once.

    Every trigger with the same ``queue_url``, ``aws_conn_id`` and ``region_name`` shares one
    long-polling receiver in the triggerer; each sees every message. A message is deleted only
    after every watcher online when it arrived has moved past it and its asset events are
    persisted; a watcher that fails makes it come back; a ``reject`` sends it to the dead-letter
    queue. The trigger event payload is the message envelope::

        {"message_id": ..., "body": <JSON object, or text>, "attributes": {...},
         "message_attributes": {...}, "queue_url": ...}

    :param queue_url: the queue to watch.
    :param aws_conn_id: ``aws`` connection with the credentials (``aws_default``).
    :param region_name: overrides the connection's ``extra.region_name`` and the queue URL's region.
    :param match: JMESPath over the envelope; truthy fires an event. ``None`` matches everything.
    :param reject: JMESPath over the envelope; truthy dead-letters the message.
    :param dead_letter_queue_url: where rejected messages go; defaults to the queue's
        RedrivePolicy target. Without either they stay on the queue (with a warning).
    :param max_in_flight: most messages received and not yet settled.
    :param wait_time_seconds: long-poll wait of each receive (1-20).

    The receiver is built from the first watcher's arguments, so give every watcher of one
    queue the same ``dead_letter_queue_url``, ``max_in_flight`` and ``wait_time_seconds``.
    """

    producer_class: type[SqsSharedStreamProducer] = SqsSharedStreamProducer
    """The producer the triggerer builds for this trigger's stream (a subclass may swap it)."""

    def __init__(
        self,
        queue_url: str,
        *,
        aws_conn_id: str = SqsHook.default_conn_name,
        region_name: str | None = None,
        match: str | None = None,
        reject: str | None = None,
        dead_letter_queue_url: str | None = None,
        max_in_flight: int = DEFAULT_MAX_IN_FLIGHT,
        wait_time_seconds: int = 20,
    ) -> None:
        super().__init__(match=match, reject=reject, max_in_flight=max_in_flight)
        QueueUrl.parse(queue_url)
        if dead_letter_queue_url is not None and QueueUrl.parse(dead_letter_queue_url).url == queue_url:
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

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (
            f"{type(self).__module__}.{type(self).__qualname__}",
            {
                "queue_url": self.queue_url,
                "aws_conn_id": self.aws_conn_id,
                "region_name": self.region_name,
                "dead_letter_queue_url": self.dead_letter_queue_url,
                "wait_time_seconds": self.wait_time_seconds,
                **self._common_kwargs(),
            },
        )

    def shared_stream_key(self) -> Hashable:
        return ("airflow_shared_stream.sqs", self.queue_url, self.aws_conn_id, self.region_name)

    @classmethod
    def create_shared_stream_producer(cls, kwargs: dict[str, Any]) -> SqsSharedStreamProducer:
        return cls.producer_class(
            queue_url=kwargs["queue_url"],
            aws_conn_id=kwargs["aws_conn_id"],
            region_name=kwargs["region_name"],
            dead_letter_queue_url=kwargs["dead_letter_queue_url"],
            max_in_flight=kwargs["max_in_flight"],
            wait_time_seconds=kwargs["wait_time_seconds"],
        )
