"""
ACK on Service Bus: complete runs of messages with one disposition each, one by one where not.

See :mod:`.ranges` for the mechanism. A broker that does not confirm a range in time costs
speed, never a redelivery: its messages are completed one by one while their locks still hold,
and if any of them had not been completed by the range, the stream completes one by one from
then on.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from typing import Any

from airflow_shared_stream.common.leased_queue import Delivery
from airflow_shared_stream.servicebus.errors import is_lock_lost
from airflow_shared_stream.servicebus.locks import delivery_lock_left
from airflow_shared_stream.servicebus.parts import StreamOwner
from airflow_shared_stream.servicebus.ranges import RangeLink, RangeUnconfirmed, completion_runs

log = logging.getLogger(__name__)


class RangeCompleter:
    """
    Completes the ACKs of one stream in ranges while the broker applies them.

    :param enabled: ``complete_in_ranges``; ``False`` completes every message one by one.
    :param management_of: the lock a ``$management`` request on a receiver takes.
    :param owner: the stream, told of a completion refused because a lock was lost.
    :param settled: told of each delivery settled (or given up).
    """

    def __init__(
        self,
        *,
        enabled: bool,
        management_of: Callable[[Any], asyncio.Lock],
        owner: StreamOwner,
        settled: Callable[[Delivery[Any]], None],
    ) -> None:
        self._enabled = enabled
        self._management_of = management_of
        self._owner = owner
        self._settled = settled
        self.completed = 0
        """Runs of messages completed with one disposition each."""
        self.unconfirmed = 0
        """Runs whose outcome the broker did not confirm in time: completed one by one instead."""
        self.ignored = False
        """The broker left a delivery of a range unsettled: completing one by one from then on."""

    def runs(
        self, deliveries: Sequence[Delivery[Any]]
    ) -> tuple[list[tuple[RangeLink, list[Delivery[Any]]]], list[Delivery[Any]]]:
        """Split an ACK batch into runs completed with one disposition each, and the rest."""
        if not self._enabled or self.ignored:
            return [], list(deliveries)
        return completion_runs(deliveries, lambda d: d.handle.message, lambda d: d.handle.receiver)

    async def complete(self, run: tuple[RangeLink, list[Delivery[Any]]]) -> None:
        """
        Complete one run with one disposition; a lost lock is counted, as for one message.

        A refused range says only that some delivery of it was refused: the ones Service Bus did
        complete are gone, the others come back when their locks run out (at-least-once either
        way), so it is counted once, not per message.
        """
        link, deliveries = run
        first, last = self._owner.label(deliveries[0]), self._owner.label(deliveries[-1])
        what = f"{len(deliveries)} messages ({first} to {last})"
        left = [delivery_lock_left(d) for d in deliveries]
        known = [seconds for seconds in left if seconds is not None]
        try:
            await link.complete(
                [d.handle.message for d in deliveries], lock_seconds_left=min(known, default=None)
            )
            self.completed += 1
        except RangeUnconfirmed:
            self.unconfirmed += 1
            await self._complete_unconfirmed(what, deliveries)
        except Exception as exc:
            if is_lock_lost(exc):
                # Which of them Service Bus completed is not known: the others come back.
                self._owner.lock_lost(f"complete of {what}", exc)
                return
            error = self._owner.explain(f"complete {what}, settled as one range, of", exc)
            raise type(error)(
                f"{error}; complete_in_ranges=False completes them one by one instead"
            ) from None
        finally:
            for delivery in deliveries:
                self._settled(delivery)

    async def _complete_unconfirmed(self, what: str, deliveries: Sequence[Delivery[Any]]) -> None:
        """
        Complete, one by one, the messages of a range whose outcome did not come in time.

        Through ``complete_message``: the range took their tags off the link, so the SDK
        completes each through ``$management`` (one request at a time: they must not race on one
        receiver). A message the range did complete is refused as lock-lost, which is how a
        message the range did not complete is told from it; if any was still locked, the broker
        does not apply ranges, and the stream completes one by one from then on.
        """
        still_locked = 0
        for delivery in deliveries:
            received = delivery.handle
            try:
                async with self._management_of(received.receiver):
                    await received.receiver.complete_message(received.message)
            except Exception as exc:
                if not is_lock_lost(exc):
                    raise self._owner.explain("complete a message of", exc) from None
                # Completed by the range (or its lock is gone, and it comes back): nothing to do.
                log.debug("%s was already completed, or its lock is gone", self._owner.label(delivery))
            else:
                still_locked += 1
        if still_locked and not self.ignored:
            self.ignored = True
            log.warning(
                "Service Bus did not complete %d of %s settled as one range; completed them one by "
                "one, and completing every message one by one from now on on this stream "
                "(complete_in_ranges=False says so up front)",
                still_locked,
                what,
            )
