"""AckBatcher: ACKs from many advances go out in full batches, in the background, never early."""

from __future__ import annotations

import asyncio

import pytest

from airflow_shared_stream.common.ack_batcher import AckBatcher


class Broker:
    """Records each batch; a batch is on the wire until ``release`` lets it finish (if ``gated``)."""

    def __init__(self, fail: bool = False, gated: bool = False) -> None:
        self.batches: list[list[int]] = []
        self.done: list[list[int]] = []
        self.fail = fail
        self.gate = asyncio.Event()
        if not gated:
            self.gate.set()

    async def send(self, deliveries: list[int]) -> None:
        self.batches.append(list(deliveries))
        await self.gate.wait()
        if self.fail:
            raise RuntimeError("DeleteMessageBatch refused")
        self.done.append(list(deliveries))


async def until(condition, timeout: float = 5.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, "condition not met in time"
        await asyncio.sleep(0.01)


async def test_full_batches_go_out_at_once_and_the_rest_waits():
    broker = Broker()
    batcher = AckBatcher(broker.send, batch_limit=10, linger=60)
    await batcher.add(list(range(4)))
    await asyncio.sleep(0)
    assert broker.batches == []
    await batcher.add(list(range(4, 25)))
    await until(lambda: len(broker.done) == 2)
    assert broker.batches == [list(range(10)), list(range(10, 20))]
    assert batcher.queued == list(range(20, 25))
    await batcher.drain()
    assert broker.batches[-1] == list(range(20, 25))
    assert len(batcher) == 0


async def test_add_returns_while_the_full_batch_is_still_on_the_wire():
    broker = Broker(gated=True)
    batcher = AckBatcher(broker.send, batch_limit=2, linger=60, max_sending=2)
    await asyncio.wait_for(batcher.add([1, 2, 3]), 1)
    await until(lambda: broker.batches == [[1, 2]])
    assert broker.done == []
    # Still owed: on the wire and queued, both counted until they are settled.
    assert batcher.queued == [1, 2, 3]
    assert len(batcher) == 3
    assert batcher.sending == 1
    broker.gate.set()
    await batcher.drain()
    assert broker.done == [[1, 2], [3]]
    assert len(batcher) == 0


async def test_add_waits_for_a_free_slot_when_max_sending_batches_are_on_the_wire():
    broker = Broker(gated=True)
    batcher = AckBatcher(broker.send, batch_limit=2, linger=60, max_sending=2)
    await batcher.add([1, 2, 3, 4])
    third = asyncio.create_task(batcher.add([5, 6]))
    await until(lambda: len(broker.batches) == 2)
    await asyncio.sleep(0.05)
    assert not third.done(), "a third batch must wait while two are on the wire"
    assert batcher.sending == 2
    assert len(batcher) == 6
    broker.gate.set()
    await asyncio.wait_for(third, 1)
    await batcher.drain()
    assert broker.done == [[1, 2], [3, 4], [5, 6]]


async def test_drain_waits_for_the_batches_on_the_wire():
    broker = Broker(gated=True)
    batcher = AckBatcher(broker.send, batch_limit=2, linger=60)
    await batcher.add([1, 2, 3])
    drained = asyncio.create_task(batcher.drain())
    await until(lambda: len(broker.batches) == 2)
    await asyncio.sleep(0.05)
    assert not drained.done()
    broker.gate.set()
    await asyncio.wait_for(drained, 1)
    assert broker.done == [[1, 2], [3]]


async def test_a_partial_batch_goes_out_after_the_linger():
    broker = Broker()
    batcher = AckBatcher(broker.send, batch_limit=10, linger=0.05)
    batcher.start()
    try:
        await batcher.add([1, 2])
        await batcher.add([3])
        await asyncio.sleep(0)
        assert broker.batches == []
        await until(lambda: broker.done == [[1, 2, 3]])
    finally:
        await batcher.stop()


async def test_a_failed_background_send_is_kept_for_the_stream_to_raise():
    broker = Broker(fail=True)
    batcher = AckBatcher(broker.send, batch_limit=10, linger=0.01)
    batcher.start()
    try:
        await batcher.add([1])
        await until(lambda: batcher.error is not None)
        assert isinstance(batcher.error, RuntimeError)
    finally:
        await batcher.stop()


async def test_a_failed_full_batch_is_kept_for_the_next_advance_and_no_longer_owed():
    batcher = AckBatcher(Broker(fail=True).send, batch_limit=2, linger=60)
    await batcher.add([1, 2])  # returns: the batch fails in the background
    await until(lambda: batcher.error is not None)
    assert isinstance(batcher.error, RuntimeError)
    assert len(batcher) == 0  # its messages come back when their leases run out


async def test_drain_raises_a_failure_not_raised_yet():
    batcher = AckBatcher(Broker(fail=True).send, batch_limit=2, linger=60)
    await batcher.add([1])
    with pytest.raises(RuntimeError, match="refused"):
        await batcher.drain()
    assert batcher.error is None


async def test_stop_cancels_the_sends_still_on_the_wire():
    broker = Broker(gated=True)
    batcher = AckBatcher(broker.send, batch_limit=2, linger=60)
    batcher.start()
    await batcher.add([1, 2])
    await until(lambda: batcher.sending == 1)
    await batcher.stop()
    assert batcher.sending == 0
    assert broker.done == []


async def test_put_queues_without_sending_and_says_when_a_batch_is_full():
    """The ACK-only advance's half of ``add``: nothing goes out until the caller sends full batches."""
    broker = Broker()
    batcher = AckBatcher(broker.send, batch_limit=10, linger=60)
    assert batcher.put(list(range(9))) is False
    assert batcher.put([9, 10]) is True
    await asyncio.sleep(0)
    assert broker.batches == [], "put never starts a send"
    await batcher.send_full()
    await until(lambda: len(broker.done) == 1)
    assert broker.batches == [list(range(10))]
    assert batcher.queued == [10]
    await batcher.drain()
    assert broker.batches[-1] == [10]
