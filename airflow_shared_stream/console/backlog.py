"""
What a broker says is waiting, asked by the api-server directly where that is one cheap call.

SQS answers ``GetQueueAttributes`` with approximate counts for the source queue (visible, and
in flight: received by a consumer and not yet deleted) and its dead-letter queue: one call each,
read with the stream's own connection, at most once per :data:`CACHE_SECONDS` per queue however
many people keep the page open. The other brokers have no such call that is not a consumer
operation (Kafka lag needs the group's committed offsets and every partition's end offset;
Pub/Sub's backlog is a Cloud Monitoring metric; Service Bus counts come from the management
API), so the page shows their backlog as unknown.

Errors never reach the page as text: a failed read is reported by its exception's type only,
so nothing the broker echoes back (a signed URL, a key id) can show.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

log = logging.getLogger(__name__)

CACHE_SECONDS = 10.0
TIMEOUT_SECONDS = 5.0

_cache: dict[tuple[str, str, str], tuple[float, dict[str, Any]]] = {}


async def sqs_depth(conn_id: str, queue_url: str, region_name: str | None) -> dict[str, Any]:
    """``{"visible": n, "in_flight": n}`` of one queue, or ``{"error": "<type>"}``; cached."""
    cache_key = (conn_id, queue_url, region_name or "")
    cached = _cache.get(cache_key)
    if cached is not None and time.monotonic() - cached[0] < CACHE_SECONDS:
        return cached[1]
    try:
        depth = await asyncio.wait_for(_read_sqs_depth(conn_id, queue_url, region_name), TIMEOUT_SECONDS)
    except Exception as exc:
        log.info("Could not read the depth of an SQS queue of connection %s: %s", conn_id, type(exc).__name__)
        depth = {"error": type(exc).__name__}
    _cache[cache_key] = (time.monotonic(), depth)
    return depth


async def _read_sqs_depth(conn_id: str, queue_url: str, region_name: str | None) -> dict[str, Any]:
    from aiobotocore.config import AioConfig

    from airflow_shared_stream.sqs.credentials import open_sqs_client
    from airflow_shared_stream.sqs.hook import QueueUrl, SqsSharedStreamHook

    queue = QueueUrl.parse(queue_url)
    config = await SqsSharedStreamHook(conn_id).aget_client_config(region_name=region_name, queue=queue)
    botocore_config = AioConfig(connect_timeout=3, read_timeout=3, retries={"max_attempts": 1})
    async with open_sqs_client(config, botocore_config, on_secrets=lambda _secrets: None) as client:
        answer = await client.get_queue_attributes(
            QueueUrl=queue.url,
            AttributeNames=["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"],
        )
    attributes = answer.get("Attributes", {})
    return {
        "visible": int(attributes.get("ApproximateNumberOfMessages", 0)),
        "in_flight": int(attributes.get("ApproximateNumberOfMessagesNotVisible", 0)),
    }


async def broker_backlog(broker: str, trigger_kwargs: dict[str, Any]) -> dict[str, Any] | None:
    """The stream's backlog and dead-letter depth where the broker tells it cheaply, else ``None``."""
    if broker != "sqs":
        return None
    conn_id = trigger_kwargs.get("aws_conn_id") or "aws_default"
    region = trigger_kwargs.get("region_name")
    source = await sqs_depth(conn_id, trigger_kwargs["queue_url"], region)
    backlog: dict[str, Any] = {"source": source, "read_at": time.time()}
    dead_letter_url = trigger_kwargs.get("dead_letter_queue_url")
    if dead_letter_url:
        backlog["dead_letter"] = await sqs_depth(conn_id, dead_letter_url, region)
    return backlog
