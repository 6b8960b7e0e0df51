from __future__ import annotations

import asyncio

from airflow_shared_stream.common.leases import LeaseKeeper


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class RecordingBroker:
    def __init__(self, fail: bool = False) -> None:
        self.calls: list[tuple[list[str], float]] = []
        self.fail = fail

    async def extend(self, handles: list[str], seconds: float) -> None:
        self.calls.append((sorted(handles), seconds))
        if self.fail:
            raise ConnectionError("broker unreachable")


async def test_extends_held_leases_and_stops_after_settlement():
    broker, clock = RecordingBroker(), FakeClock()
    keeper = LeaseKeeper(broker.extend, lease_seconds=30, max_hold_seconds=300, clock=clock)
    keeper.hold("a")
    keeper.hold("b")
    assert await keeper.renew_once() == 2
    async with keeper.settling(["a"]):
        pass
    assert await keeper.renew_once() == 1
    assert broker.calls == [(["a", "b"], 30), (["b"], 30)]


async def test_stops_extending_past_the_ack_timeout():
    broker, clock = RecordingBroker(), FakeClock()
    keeper = LeaseKeeper(broker.extend, lease_seconds=30, max_hold_seconds=300, clock=clock)
    keeper.hold("old")
    clock.now = 200
    keeper.hold("new")
    clock.now = 301
    assert await keeper.renew_once() == 1
    assert broker.calls == [(["new"], 30)]
    assert "old" not in keeper


async def test_a_failed_renewal_is_retried_not_fatal():
    broker = RecordingBroker(fail=True)
    keeper = LeaseKeeper(broker.extend, lease_seconds=30, max_hold_seconds=300)
    keeper.hold("a")
    assert await keeper.renew_once() == 0
    broker.fail = False
    assert await keeper.renew_once() == 1


async def test_a_renewal_never_carries_a_message_whose_settlement_began():
    extended: list[list[str]] = []

    async def extend(handles: list[str], seconds: float) -> None:
        extended.append(handles)

    keeper = LeaseKeeper(extend, lease_seconds=30, max_hold_seconds=300)
    keeper.hold("a")
    keeper.hold("b")
    async with keeper.settling(["a"]):
        await keeper.renew_once()
    assert extended == [["b"]]


async def test_a_settlement_waits_for_the_renewal_call_already_carrying_its_message():
    order: list[str] = []
    renewal_on_the_wire = asyncio.Event()
    release_renewal = asyncio.Event()

    async def extend(handles: list[str], seconds: float) -> None:
        order.append(f"extend {handles} sent")
        renewal_on_the_wire.set()
        await release_renewal.wait()
        order.append(f"extend {handles} answered")

    keeper = LeaseKeeper(extend, lease_seconds=30, max_hold_seconds=300)
    keeper.hold("a")
    renewal = asyncio.create_task(keeper.renew_once())
    await renewal_on_the_wire.wait()

    async def settle() -> None:
        async with keeper.settling(["a"]):
            order.append("settle a")

    settlement = asyncio.create_task(settle())
    await asyncio.sleep(0.01)
    assert order == ["extend ['a'] sent"], "the settlement overtook a renewal of the same message"
    release_renewal.set()
    await asyncio.gather(renewal, settlement)
    assert order == ["extend ['a'] sent", "extend ['a'] answered", "settle a"]


async def test_a_slow_settlement_does_not_stop_other_leases_being_renewed():
    """Issue 7 item 10: no lock spans a settlement (dead-letter retries) and a renewal pass."""
    extended: list[list[str]] = []

    async def extend(handles: list[str], seconds: float) -> None:
        extended.append(handles)

    keeper = LeaseKeeper(extend, lease_seconds=30, max_hold_seconds=300)
    keeper.hold("a")
    keeper.hold("b")
    settling_entered = asyncio.Event()
    finish_settlement = asyncio.Event()

    async def slow_settle() -> None:
        async with keeper.settling(["a"]):
            settling_entered.set()
            await finish_settlement.wait()  # a dead-letter send retrying

    settlement = asyncio.create_task(slow_settle())
    await settling_entered.wait()
    assert await asyncio.wait_for(keeper.renew_once(), timeout=1.0) == 1
    assert extended == [["b"]]
    finish_settlement.set()
    await settlement


async def test_a_pass_renews_in_chunks_so_a_settlement_waits_for_one_call_only():
    calls: list[list[str]] = []

    async def extend(handles: list[str], seconds: float) -> None:
        calls.append(handles)

    keeper = LeaseKeeper(extend, lease_seconds=30, max_hold_seconds=300, batch_size=2)
    for handle in "abcde":
        keeper.hold(handle)
    assert await keeper.renew_once() == 5
    assert calls == [["a", "b"], ["c", "d"], ["e"]]


async def test_leases_the_broker_refuses_are_lost_and_counted():
    lost_counts: list[int] = []

    async def extend(handles: list[str], seconds: float) -> list[str]:
        return ["a"]

    keeper = LeaseKeeper(extend, lease_seconds=30, max_hold_seconds=300, on_lost=lost_counts.append)
    keeper.hold("a")
    keeper.hold("b")
    assert await keeper.renew_once() == 1
    assert "a" not in keeper
    assert "b" in keeper
    assert lost_counts == [1]


async def test_background_task_renews_on_schedule():
    broker = RecordingBroker()
    keeper = LeaseKeeper(broker.extend, lease_seconds=0.3, max_hold_seconds=300)
    keeper.hold("a")
    keeper.start()
    await asyncio.sleep(0.35)
    await keeper.stop()
    assert len(broker.calls) >= 2
