"""AckBatcher: ACKs from many advances go out in full batches, never before they are queued."""

from __future__ import annotations

import asyncio

import pytest

from airflow_shared_stream.common.leased_queue import AckBatcher


class Broker:
    def __init__(self, fail: bool = False) -> None:
        self.batches: list[list[int]] = []
        self.fail = fail

    async def send(self, deliveries: list[int]) -> None:
        if self.fail:
            raise RuntimeError("DeleteMessageBatch refused")
        self.batches.append(list(deliveries))


async def test_full_batches_go_out_at_once_and_the_rest_waits():
    broker = Broker()
    batcher = AckBatcher(broker.send, batch_limit=10, linger=60)
    await batcher.add(list(range(4)))
    assert broker.batches == []
    await batcher.add(list(range(4, 25)))
    assert broker.batches == [list(range(10)), list(range(10, 20))]
    assert batcher.queued == list(range(20, 25))
    await batcher.flush()
    assert broker.batches[-1] == list(range(20, 25))
    assert len(batcher) == 0


async def test_a_partial_batch_goes_out_after_the_linger():
    broker = Broker()
    batcher = AckBatcher(broker.send, batch_limit=10, linger=0.05)
    batcher.start()
    try:
        await batcher.add([1, 2])
        await batcher.add([3])
        assert broker.batches == []
        for _ in range(100):
            if broker.batches:
                break
            await asyncio.sleep(0.02)
        assert broker.batches == [[1, 2, 3]]
    finally:
        await batcher.stop()


async def test_a_failed_background_send_is_kept_for_the_stream_to_raise():
    broker = Broker(fail=True)
    batcher = AckBatcher(broker.send, batch_limit=10, linger=0.01)
    batcher.start()
    try:
        await batcher.add([1])
        for _ in range(100):
            if batcher.error is not None:
                break
            await asyncio.sleep(0.02)
        assert isinstance(batcher.error, RuntimeError)
    finally:
        await batcher.stop()


async def test_a_failed_full_batch_raises_in_the_advance_that_filled_it():
    batcher = AckBatcher(Broker(fail=True).send, batch_limit=2, linger=60)
    with pytest.raises(RuntimeError, match="refused"):
        await batcher.add([1, 2])
