"""
What the Streams page, redrive and the ``shared+sqs`` scheme ask of SQS.

:class:`~airflow_shared_stream.common.operations.BrokerOperations`, in SQS's words.

The backlog is ``GetQueueAttributes`` of the source queue (visible, and in flight: received and
not yet deleted) and of its dead-letter queue: one call each, nothing received.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from aiobotocore.config import AioConfig

from airflow_shared_stream.common.errors import SecretScrubber
from airflow_shared_stream.common.operations import Backlog, BrokerOperations, DepthRead
from airflow_shared_stream.common.redrive import DeadLetterSource
from airflow_shared_stream.sqs.credentials import open_sqs_client, sdk_logger_names
from airflow_shared_stream.sqs.hook import QueueUrl, SqsSharedStreamHook
from airflow_shared_stream.sqs.redrive import dead_letter_source
from airflow_shared_stream.sqs.trigger import SqsSharedStreamTrigger

SDK_MODULES = ("aiobotocore.session", "aiobotocore.credentials")
"""What a depth read's client imports on first use (the module imports only the client's config)."""
SDK_TIMEOUT_SECONDS = 3
"""The SDK's own connect and read timeouts of a depth read, inside the page's bound."""


def queue_depth(conn_id: str, queue_url: str, region_name: str | None) -> DepthRead:
    """``{"visible": n, "in_flight": n, "depth": n}`` of one queue."""
    return DepthRead(
        ("sqs:" + conn_id, queue_url, region_name or ""),
        "the depth of an SQS queue",
        lambda: _read_depth(conn_id, queue_url, region_name),
        SDK_MODULES,
    )


async def _read_depth(conn_id: str, queue_url: str, region_name: str | None) -> dict[str, Any]:
    queue = QueueUrl.parse(queue_url)
    config = await SqsSharedStreamHook(conn_id).aget_client_config(region_name=region_name, queue=queue)
    botocore_config = AioConfig(
        connect_timeout=SDK_TIMEOUT_SECONDS, read_timeout=SDK_TIMEOUT_SECONDS, retries={"max_attempts": 1}
    )
    # botocore logs each signed request at DEBUG, a role's session token included: scrubbed while
    # the read lasts (not told to Airflow's masker, which would keep every read's new token).
    scrubber = SecretScrubber(tell_masker=False)
    try:
        async with open_sqs_client(
            config, botocore_config, on_secrets=lambda secrets: scrubber.add(*secrets)
        ) as client:
            scrubber.install(*sdk_logger_names())
            answer = await client.get_queue_attributes(
                QueueUrl=queue.url,
                AttributeNames=["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"],
            )
    finally:
        scrubber.uninstall(*sdk_logger_names())
    attributes = answer.get("Attributes", {})
    visible = int(attributes.get("ApproximateNumberOfMessages", 0))
    in_flight = int(attributes.get("ApproximateNumberOfMessagesNotVisible", 0))
    return {"visible": visible, "in_flight": in_flight, "depth": visible + in_flight}


class SqsOperations(BrokerOperations):
    trigger = SqsSharedStreamTrigger
    hook = SqsSharedStreamHook
    dead_letter_argument = "dead_letter_queue_url"
    redrive_options = frozenset({"region_name", "lease_seconds"})

    def backlog(self, trigger_kwargs: Mapping[str, Any]) -> Backlog:
        conn_id = self.connection_or_default(trigger_kwargs)
        region = trigger_kwargs.get("region_name")
        backlog = {"source": queue_depth(conn_id, trigger_kwargs["queue_url"], region)}
        dead_letter_url = trigger_kwargs.get("dead_letter_queue_url")
        if dead_letter_url:
            backlog["dead_letter"] = queue_depth(conn_id, dead_letter_url, region)
        return backlog

    def redrive_ends(
        self, upstream: Mapping[str, Any], dead_letter: Any
    ) -> tuple[str | None, str | None] | None:
        """From the dead-letter queue to the stream's queue."""
        if not dead_letter:
            return None
        return upstream.get("queue_url"), dead_letter

    def dead_letter_source(self, **kwargs: Any) -> DeadLetterSource:
        return dead_letter_source(**kwargs)


OPERATIONS = SqsOperations()
