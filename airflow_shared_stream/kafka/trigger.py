"""
``KafkaSharedStreamTrigger``: watch Kafka topics from an ``AssetWatcher``, at least once.

Every watcher with the same topics (in any order), connection and consumer group shares one
aiokafka consumer in the triggerer; each evaluates its own ``match`` and ``reject`` over the
message envelope::

    {"topic": "orders", "partition": 3, "offset": 1742, "timestamp": 1763740000000,
     "key": "customer-17", "value": {"type": "order_created", ...}, "headers": {"source": "web"}}

``value`` is the decoded body (JSON to an object, other UTF-8 text as text); keys and header
values are text, or ``"base64:..."`` when they are not UTF-8. The envelope is the trigger event's
payload, so it lands in ``AssetEvent.extra["payload"]``.
"""

from __future__ import annotations

import asyncio
import warnings
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, ClassVar

from airflow.exceptions import AirflowProviderDeprecationWarning
from airflow.triggers.base import TriggerEvent

from airflow_shared_stream.common.errors import require_sdk
from airflow_shared_stream.common.figures import figures_stream_id, one_asset_writer
from airflow_shared_stream.common.matching import RawMessage
from airflow_shared_stream.common.trigger import (
    DEFAULT_MAX_IN_FLIGHT,
    DEFAULT_MAX_PAYLOAD_BYTES,
    SharedStreamTrigger,
    warn_renamed,
)
from airflow_shared_stream.kafka.errors import KafkaConfigurationError
from airflow_shared_stream.kafka.identity import normalise_topics
from airflow_shared_stream.kafka.watchers import (
    Receipt,
    StreamWatchers,
    stream_ref,
    watcher_digest,
    watchers_of,
)

require_sdk("aiokafka", "kafka")

# The keyword arguments the trigger took positionally before they became keyword-only, in order.
_FORMER_POSITIONAL = (
    "kafka_config_id",
    "group_id",
    "match",
    "reject",
    "dead_letter_topic",
    "max_in_flight",
    "max_payload_bytes",
)


class KafkaSharedStreamTrigger(SharedStreamTrigger):
    """
    Fire one trigger event per Kafka message this watcher's ``match`` selects.

    :param topics: topic name or names to consume (the only positional argument).
    :param kafka_config_id: Airflow connection of type ``kafka``, as Airflow's Kafka provider
        names it (client settings in its extra, in librdkafka spelling; see
        :mod:`airflow_shared_stream.kafka.hook`). ``kafka_conn_id`` still works, with a
        deprecation warning.
    :param group_id: consumer group, used verbatim. Without one, a stable per-stream id is
        derived from the topics and the connection, prefixed with the connection's ``group.id``
        when it sets one (see :mod:`airflow_shared_stream.kafka.identity`).
    :param match: JMESPath over the envelope; truthy fires a trigger event (``None``: every message).
    :param reject: JMESPath over the envelope; truthy dead-letters the message.
    :param dead_letter_topic: topic that rejected and unprocessable records are produced to before
        their offset is committed past. Without one they are logged and committed past.
    :param max_in_flight: most messages read but not yet settled (the credit window).
    :param max_payload_bytes: larger record values are not turned into trigger events but
        dead-lettered.

    Watchers with the same topics (in any order), connection and ``group_id`` read one stream
    and share one consumer. ``dead_letter_topic``, ``max_in_flight`` and ``max_payload_bytes``
    shape that consumer: they never split the stream or change its group, and a watcher that
    disagrees with the stream's other watchers on one of them fails, naming the argument.
    """

    broker: ClassVar[str] = "kafka"
    identity_fields: ClassVar[tuple[str, ...]] = ("topics", "kafka_config_id", "group_id")
    shaping_fields: ClassVar[tuple[str, ...]] = ("dead_letter_topic",)
    producer_path = "airflow_shared_stream.kafka.producer:KafkaSharedStreamProducer"
    every_triggerer_reads_everything: ClassVar[bool] = True

    def __init__(
        self,
        topics: str | Sequence[str],
        *args: Any,
        kafka_config_id: str | None = None,
        group_id: str | None = None,
        match: str | None = None,
        reject: str | None = None,
        dead_letter_topic: str | None = None,
        max_in_flight: int = DEFAULT_MAX_IN_FLIGHT,
        max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES,
        kafka_conn_id: str | None = None,
    ) -> None:
        given: dict[str, Any] = {
            "kafka_config_id": kafka_config_id,
            "group_id": group_id,
            "match": match,
            "reject": reject,
            "dead_letter_topic": dead_letter_topic,
            "max_in_flight": max_in_flight,
            "max_payload_bytes": max_payload_bytes,
        }
        if args:
            given.update(_former_positional(args))
        if kafka_conn_id is not None:
            warn_renamed("kafka_conn_id", "kafka_config_id", type(self).__name__)
            if given["kafka_config_id"] is not None and given["kafka_config_id"] != kafka_conn_id:
                raise TypeError("give kafka_config_id or the deprecated kafka_conn_id, not both")
            given["kafka_config_id"] = kafka_conn_id
        super().__init__(
            match=given["match"],
            reject=given["reject"],
            max_in_flight=given["max_in_flight"],
            max_payload_bytes=given["max_payload_bytes"],
        )
        self.topics = normalise_topics(topics)
        self.kafka_config_id: str = given["kafka_config_id"] or "kafka_default"
        self.group_id: str | None = given["group_id"]
        self.dead_letter_topic: str | None = given["dead_letter_topic"]
        if self.dead_letter_topic is not None and self.dead_letter_topic in self.topics:
            # Each dead letter would be read again, rejected again and copied again, for ever
            # (the redrive refuses the same route: docs/redrive.rst).
            raise KafkaConfigurationError(
                f"dead_letter_topic {self.dead_letter_topic!r} is one of the topics the stream reads: "
                "every rejected record would come straight back, be rejected again and copied again"
            )
        self._receipt: Receipt | None = None

    @property
    def kafka_conn_id(self) -> str:
        """Deprecated alias of :attr:`kafka_config_id`."""
        return self.kafka_config_id

    def metrics_stream_name(self) -> str:
        return ".".join(sorted(set(self.topics)))

    def watcher_digest(self) -> str:
        """This watcher's durable identity (its own position's key; see :mod:`.watchers`)."""
        stream = stream_ref(self.topics, self.kafka_config_id, self.group_id)
        return watcher_digest(stream, self.match, self.reject)

    def filter_shared_stream(self, shared_stream: AsyncIterator[Any]) -> AsyncIterator[TriggerEvent]:
        """The common filter, over the stream as this subscriber finishes it (:class:`.Receipt`)."""
        self._receipt = Receipt(shared_stream)
        return super().filter_shared_stream(self._receipt)

    @contextmanager
    def _watching(self) -> Iterator[Callable[[RawMessage], bool] | None]:
        """
        The common hold, plus this watcher's own position: records it passed are let go unevaluated.

        The watcher joins its stream's registry here, the one place of ours that runs for every
        watcher inside the triggerer; the producer admits it (loads its position) from its loop.
        It leaves when the filter ends or when the task running it ends, whichever comes first:
        a cancelled ``run_trigger`` unsubscribes at once, but core may close the suspended filter
        generator only at its next loop (:mod:`.watchers`).
        """
        with super()._watching():
            watchers = watchers_of(stream_ref(self.topics, self.kafka_config_id, self.group_id))
            receipt = self._receipt
            cursor = watchers.join(self.watcher_digest(), self._watcher_name(), receipt)
            carrier = _carry_memory(self, watchers)
            left = False

            def leave(_: object = None) -> None:
                nonlocal left
                if not left:
                    left = True
                    watchers.leave(cursor, receipt)
                    if carrier is not None:
                        watchers.carriers.pop(carrier, None)

            task = asyncio.current_task()
            if task is not None:
                task.add_done_callback(leave)
            try:
                yield cursor.passed if receipt is None else _taking(receipt, cursor.passed)
            finally:
                if task is not None:
                    task.remove_done_callback(leave)
                leave()


def _carry_memory(trigger: KafkaSharedStreamTrigger, watchers: StreamWatchers) -> int | None:
    """Offer this watcher's asset state store to its stream's memory of topic ids (:mod:`.topic_memory`)."""
    store = getattr(trigger, "asset_state_store", None)
    trigger_id = getattr(trigger, "trigger_id", None)
    if store is None or trigger_id is None:
        return None
    try:
        watchers.carriers[trigger_id] = (
            figures_stream_id(trigger.shared_stream_key()),
            one_asset_writer(store),
        )
    except Exception:  # never keeps a watcher from running
        return None
    return int(trigger_id)


def _taking(receipt: Receipt, passed: Callable[[RawMessage], bool]) -> Callable[[RawMessage], bool]:
    """``passed``, noting on ``receipt`` each record the filter pulls first."""
    took = receipt.took

    def taking(message: RawMessage) -> bool:
        took(message.seq)
        return passed(message)

    return taking


def _former_positional(args: tuple[Any, ...]) -> dict[str, Any]:
    """Map arguments given positionally in the old signature, warning with the new spelling."""
    if len(args) > len(_FORMER_POSITIONAL):
        raise TypeError(
            f"KafkaSharedStreamTrigger takes the topics and keyword arguments; got {len(args) + 1} positional"
        )
    names = _FORMER_POSITIONAL[: len(args)]
    spelled = ", ".join(f"{name}=..." for name in names)
    warnings.warn(
        f"KafkaSharedStreamTrigger(topics, <{len(args)} more positional>) is deprecated; pass "
        f"everything after the topics by keyword: KafkaSharedStreamTrigger(topics, {spelled})",
        AirflowProviderDeprecationWarning,
        stacklevel=3,
    )
    return dict(zip(names, args, strict=True))
