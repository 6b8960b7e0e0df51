"""
moto's SQS made safe for concurrent requests on one queue, as every rig here serves it.

moto 5.2's ``Queue.delete_message`` rebuilds the queue's message list and assigns it back, without
the queue's lock. Its server answers each request on a thread of its own, so two deletes on one
queue each rebuild the list as it was before either ran, and whichever assigns last puts back the
message the other deleted. That message comes back after its visibility timeout, with a higher
``ApproximateReceiveCount``: a redelivery real SQS would not make. A shared stream sends its delete
batches concurrently (any SQS consumer may), so the reliability runs showed ten duplicates per
watcher in runs with no fault at all, a whole delete batch restored (found 2026-11-24 by recording
the stream's receives and deletes: the duplicated messages' ``DeleteMessageBatch`` had succeeded).
A send racing a delete can lose the sent message the same way, which a test would blame on the
provider. ``ReceiveMessage`` walks the same list and marks messages received without the lock
either, so two concurrent receives can both hand out one message (tests/integration/sqs/
test_moto_rig.py shows both races on an unguarded server).

:func:`serialize_queue_mutations` runs both under the queue's own lock (moto's
``Queue._messages_lock``, which ``SendMessage`` already takes). It is a re-entrant condition, and
a receive that long-polls waits on it (``Queue.wait_for_messages``), which releases it: the other
requests proceed while a receive waits, as before. Idempotent; called in every moto a stream reads
here: the test suite's and the reliability rig's (``MotoServer`` in tests/support/brokers.py) and
the benchmarks' (``python -m tests.support.moto_sqs``, below). The two that only refuse credentials
(the secret tests) run moto as it is.

It also makes moto's receive linear in the queue's length. For every message it hands out,
``ReceiveMessage`` checks the retention period through ``get_queue_attributes``, which computes
every attribute of the queue, three of them by scanning every message (twice over, as it looks
each name up in the freshly built dict): a receive from a queue of n messages costs O(n) scans
per message, and draining 1,000 messages spent most of a core in moto, under the GIL of the
process that runs the stream under test. The check reads the queue's retention period directly,
with the same comparison.
"""

from __future__ import annotations

import functools
from typing import Any

_PATCHED = "_airflow_shared_stream_serialized"


def serialize_queue_mutations() -> None:
    """Make moto's SQS ``delete_message`` and ``receive_message`` atomic per queue (see the module)."""
    from moto.sqs.models import Queue, SQSBackend

    if getattr(Queue.delete_message, _PATCHED, False):
        return
    delete_message = Queue.delete_message
    receive_message = SQSBackend.receive_message

    @functools.wraps(delete_message)
    def locked_delete_message(queue: Any, receipt_handle: str) -> None:
        with queue._messages_lock:
            delete_message(queue, receipt_handle)

    @functools.wraps(receive_message)
    def locked_receive_message(backend: Any, queue_name: str, *args: Any, **kwargs: Any) -> Any:
        with backend.get_queue(queue_name)._messages_lock:
            return receive_message(backend, queue_name, *args, **kwargs)

    def retained(backend: Any, queue_name: str, message: Any) -> bool:
        """moto's ``is_message_valid_based_on_retention_period`` without computing every attribute."""
        from moto.core.utils import unix_time

        retention_period = backend.get_queue(queue_name).message_retention_period
        return bool(retention_period + message.sent_timestamp / 1000 > unix_time())

    setattr(locked_delete_message, _PATCHED, True)
    Queue.delete_message = locked_delete_message  # type: ignore[method-assign]
    SQSBackend.receive_message = locked_receive_message  # type: ignore[method-assign]
    SQSBackend.is_message_valid_based_on_retention_period = retained  # type: ignore[method-assign]


if __name__ == "__main__":
    # ``python -m tests.support.moto_sqs -H 127.0.0.1 -p PORT``: moto's own server, guarded, for
    # the benchmarks, which run moto in a process of its own.
    import sys

    from moto.server import main

    from tests.support.moto_dead_letter_source import record_dead_letter_source

    serialize_queue_mutations()
    record_dead_letter_source()
    main(sys.argv[1:])
