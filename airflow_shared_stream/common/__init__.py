"""
Broker-independent parts every shared-stream producer and trigger is built from.

A new broker is three parts, written in this order (docs/writing-a-broker.rst):

1. ``<broker>/hook.py``: an Airflow Connection to client settings (and the secrets to scrub);
2. ``<broker>/producer.py``: a :class:`~.leased_queue.LeasedQueueProducer` subclass with the
   broker's receive / ack / redeliver / dead-letter / extend-lease calls;
3. ``<broker>/trigger.py``: a :class:`~.trigger.SharedStreamTrigger` subclass declaring its
   identity and producer-shaping fields and its ``producer_class``.
"""

from __future__ import annotations

from airflow_shared_stream.common.errors import (
    SecretScrubber,
    SharedStreamAccessError,
    SharedStreamConfigurationError,
    SharedStreamEndpointError,
    SharedStreamError,
    SharedStreamNotFoundError,
    StreamShapeConflictError,
)
from airflow_shared_stream.common.flow_control import CreditWindow, ack_timeout_seconds, subscriber_queue_size
from airflow_shared_stream.common.matching import EnvelopeMatcher, RawMessage, Verdict, build_message
from airflow_shared_stream.common.renamed import renamed_names
from airflow_shared_stream.common.trigger import SharedStreamTrigger

__all__ = [
    "CreditWindow",
    "DeadLetter",
    "Delivery",
    "EnvelopeMatcher",
    "LeaseKeeper",
    "LeasedQueueProducer",
    "RawMessage",
    "SecretScrubber",
    "Settlement",
    "SharedStreamAccessError",
    "SharedStreamConfigurationError",
    "SharedStreamEndpointError",
    "SharedStreamError",
    "SharedStreamNotFoundError",
    "SharedStreamTrigger",
    "StreamMetrics",
    "StreamShapeConflictError",
    "Verdict",
    "ack_timeout_seconds",
    "build_message",
    "chunked",
    "decide",
    "split_by_settlement",
    "subscriber_queue_size",
]

# The producers' half is imported when first used: a trigger's module (imported on the
# triggerer's event loop) needs none of it.
__getattr__ = renamed_names(
    __name__,
    globals(),
    {},
    {
        **dict.fromkeys(
            ("DeadLetter", "Delivery", "LeasedQueueProducer", "chunked"),
            "airflow_shared_stream.common.leased_queue",
        ),
        "LeaseKeeper": f"{__name__}.leases",
        "StreamMetrics": f"{__name__}.metrics",
        **dict.fromkeys(
            ("Settlement", "decide", "split_by_settlement"), "airflow_shared_stream.common.settlement"
        ),
    },
)
