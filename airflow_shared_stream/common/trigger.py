"""The part of every broker's trigger that does not depend on the broker: matching and rejects."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Hashable
from typing import Any

from airflow.triggers.base import BaseEventTrigger, TriggerEvent
from airflow.triggers.shared_stream import reject_shared_stream_event

from airflow_shared_stream.common.flow_control import validate_max_in_flight
from airflow_shared_stream.common.matching import EnvelopeMatcher, RawMessage, Verdict

log = logging.getLogger(__name__)

DEFAULT_MAX_IN_FLIGHT = 500
"""Default credit window: below the triggerer's default subscriber queue size (1024)."""

DEFAULT_MAX_PAYLOAD_BYTES = 64 * 1024
"""Largest message body turned into a trigger event; larger ones are dead-lettered.

The payload ends up in ``AssetEvent.extra`` in the metadata database and in every run's
``triggering_asset_events``: it must stay small. Producers check the body's size once per
message, before fan-out.
"""


class SharedStreamTrigger(BaseEventTrigger):
    """
    Base for this provider's broker triggers (not used directly).

    Subclasses supply the broker half: ``serialize()``, ``shared_stream_key()`` and
    ``create_shared_stream_producer()``. This class supplies the subscriber half that is the
    same for every broker: evaluate ``match``/``reject`` on each broadcast message, yield one
    :class:`TriggerEvent` whose payload is the message envelope for a match, and reject
    unprocessable or rejected messages so the producer dead-letters them.

    :param match: JMESPath expression over the envelope; a truthy result fires a trigger event.
        ``None`` matches every message.
    :param reject: JMESPath expression over the envelope; a truthy result dead-letters the
        message (checked before ``match``).
    :param max_in_flight: credit window of the shared producer: the most messages received and
        not yet settled. At most the triggerer's ``shared_stream_subscriber_queue_size``.
    """

    def __init__(
        self,
        *,
        match: str | None = None,
        reject: str | None = None,
        max_in_flight: int = DEFAULT_MAX_IN_FLIGHT,
    ) -> None:
        super().__init__()
        self.match = match
        self.reject = reject
        self.max_in_flight = validate_max_in_flight(max_in_flight)
        self._matcher = EnvelopeMatcher(match, reject)

    def _common_kwargs(self) -> dict[str, Any]:
        return {"match": self.match, "reject": self.reject, "max_in_flight": self.max_in_flight}

    def shared_stream_key(self) -> Hashable:  # pragma: no cover - every broker overrides it
        raise NotImplementedError

    async def filter_shared_stream(self, shared_stream: AsyncIterator[Any]) -> AsyncIterator[TriggerEvent]:
        async for raw in shared_stream:
            message: RawMessage = raw
            if message.unprocessable is not None:
                log.error("Rejecting unprocessable message %s: %s", message.label, message.unprocessable)
                reject_shared_stream_event()
                continue
            verdict, reason = self._matcher.evaluate(message.envelope)
            if verdict is Verdict.MATCH:
                yield TriggerEvent(message.envelope)
            elif verdict is Verdict.REJECT:
                log.warning("Rejecting message %s: %s", message.label, reason)
                reject_shared_stream_event()

    async def run(self) -> AsyncIterator[TriggerEvent]:
        """
        Refuse to run outside a shared stream.

        These triggers settle messages on the broker only through Airflow's shared-stream ack
        channel; a standalone ``run()`` could not know when a trigger event was persisted and
        would have to choose between losing and duplicating messages. The triggerer only calls
        this when ``shared_stream_key()`` raised, which is a bug worth failing loudly on.
        """
        raise RuntimeError(
            f"{type(self).__name__} runs only as a shared stream in the triggerer "
            "(apache-airflow>=3.3.2); standalone run() is not supported"
        )
        yield  # pragma: no cover - makes this an async generator
