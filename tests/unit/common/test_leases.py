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


async def test_no_renewal_overtakes_a_settlement_in_progress():
    order: list[str] = []

    async def extend(handles: list[str], seconds: float) -> None:
        order.append(f"extend {handles}")

    keeper = LeaseKeeper(extend, lease_seconds=30, max_hold_seconds=300)
    keeper.hold("a")
    keeper.hold("b")
    async with keeper.settling(["a"]):
        renewal = asyncio.create_task(keeper.renew_once())
        await asyncio.sleep(0.01)
        order.append("settle a")
    await renewal
    assert order == ["settle a", "extend ['b']"]


async def test_background_task_renews_on_schedule():
    broker = RecordingBroker()
    keeper = LeaseKeeper(broker.extend, lease_seconds=0.3, max_hold_seconds=300)
    keeper.hold("a")
    keeper.start()
    await asyncio.sleep(0.35)
    await keeper.stop()
    assert len(broker.calls) >= 2
