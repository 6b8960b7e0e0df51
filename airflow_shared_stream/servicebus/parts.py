"""What the Service Bus producer offers the parts it is built from (sessions, locks, completion)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from airflow_shared_stream.common.delivery import Delivery
    from airflow_shared_stream.servicebus.errors import ServiceBusSharedStreamError


class StreamOwner(Protocol):
    """
    The stream a part works for: it explains the SDK's errors, counts lost locks, names messages.

    One object instead of a callback each, so every part's signature says the same thing once.
    """

    def explain(self, action: str, exc: BaseException) -> ServiceBusSharedStreamError:
        """The stream's (secret-free) error for an SDK error raised while doing ``action``."""
        ...

    def lock_lost(self, what: str, exc: BaseException, *, counted_elsewhere: bool = False) -> None:
        """
        A lock was lost on ``what``: Service Bus redelivers the message, the stream logs and counts it.

        ``counted_elsewhere``: the lease keeper counts it (a lost renewal is returned to it), so
        the lease-loss metric is not raised here.
        """
        ...

    def label(self, delivery: Delivery[Any]) -> str:
        """A delivery's message named for logs, without secrets."""
        ...
