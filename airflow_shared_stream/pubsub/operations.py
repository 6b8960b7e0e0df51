"""
What the Streams page, redrive and the ``shared+pubsub`` scheme ask of Pub/Sub.

:class:`~airflow_shared_stream.common.operations.BrokerOperations`, in Pub/Sub's words.

Its backlog is not reported: it is a Cloud Monitoring metric (no emulator has it), and the only
other count, pulling the dead-letter subscription, would lease its messages. A redrive from the
page is not offered: it reads a dead-letter *subscription* and publishes to the subscription's
topic, and a stream names neither (only its dead-letter topic).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from airflow_shared_stream.common.operations import Backlog, BrokerOperations
from airflow_shared_stream.common.redrive import DeadLetterSource
from airflow_shared_stream.pubsub.hook import PubSubSharedStreamHook
from airflow_shared_stream.pubsub.redrive import dead_letter_source
from airflow_shared_stream.pubsub.trigger import PubSubSharedStreamTrigger

NOT_REPORTED = {"not_reported": "Pub/Sub reports backlogs through Cloud Monitoring only"}


class PubSubOperations(BrokerOperations):
    trigger = PubSubSharedStreamTrigger
    hook = PubSubSharedStreamHook
    dead_letter_argument = "dead_letter_topic"
    redrive_options = frozenset({"project_id", "lease_seconds"})

    def backlog(self, trigger_kwargs: Mapping[str, Any]) -> Backlog | None:
        if not trigger_kwargs.get("dead_letter_topic"):
            return None
        return {"dead_letter": dict(NOT_REPORTED)}

    def redrive_ends(
        self, upstream: Mapping[str, Any], dead_letter: Any
    ) -> tuple[str | None, str | None] | None:
        return None

    def dead_letter_source(self, **kwargs: Any) -> DeadLetterSource:
        return dead_letter_source(**kwargs)


OPERATIONS = PubSubOperations()
