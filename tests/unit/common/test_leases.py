from __future__ import annotations

import asyncio
import itertools

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


async def test_a_lease_is_renewed_well_within_its_term_when_each_call_takes_a_round_trip():
    """
    The schedule counts from the start of a pass, and a pass's calls go out together.

    Regression: passes were paced by a sleep after each pass, and a pass sent its chunks one
    after another. With 200 messages in flight at SQS's 10 per call, a pass was 20 round trips;
    under load a lease went up to its whole term between two renewals and expired (moto:
    ``ReceiptHandleIsInvalid`` for the copy already redelivered and deleted; 1,311 duplicates
    in the short_lease reliability scenario).
    """
    lease, round_trip = 0.6, 0.05
    started: dict[str, list[float]] = {}
    loop = asyncio.get_running_loop()

    async def extend(handles: list[str], seconds: float) -> None:
        for handle in handles:
            started.setdefault(handle, []).append(loop.time())
        await asyncio.sleep(round_trip)

    keeper = LeaseKeeper(extend, lease_seconds=lease, max_hold_seconds=300, batch_size=5)
    for number in range(40):  # 8 calls per pass: 0.4 s one after another
        keeper.hold(f"m{number}")
    keeper.start()
    await asyncio.sleep(1.5)
    await keeper.stop()
    gaps = [later - earlier for times in started.values() for earlier, later in itertools.pairwise(times)]
    assert gaps
    # renew_every is a third of the lease (0.2 s); a call's round trip is all a pass adds.
    assert max(gaps) < lease / 3 + 4 * round_trip, f"longest time between two renewals: {max(gaps):.2f}s"


async def test_hold_all_holds_a_receive_at_one_time_and_keeps_an_earlier_hold():
    broker, clock = RecordingBroker(), FakeClock()
    keeper = LeaseKeeper(broker.extend, lease_seconds=30, max_hold_seconds=300, clock=clock)
    keeper.hold("a")
    clock.now = 200.0
    keeper.hold_all(["a", "b", "c"])
    assert len(keeper) == 3
    clock.now = 310.0  # past the ack timeout for "a" (held at 0), not for "b" and "c" (held at 200)
    assert await keeper.renew_once() == 2
    assert broker.calls == [(["b", "c"], 30)]


async def test_renew_within_brings_the_next_pass_forward():
    # A broker that says, as it hands a message over, that its lease is shorter than planned.
    broker = RecordingBroker()
    renewed = asyncio.Event()

    async def extend(handles: list[str], seconds: float) -> None:
        await broker.extend(handles, seconds)
        renewed.set()

    keeper = LeaseKeeper(extend, lease_seconds=3600, max_hold_seconds=7200)
    keeper.hold("a")
    keeper.start()
    try:
        await asyncio.sleep(0)  # the keeper plans its first pass an hour from now
        keeper.renew_within(0.01)
        await asyncio.wait_for(renewed.wait(), 10)
        assert broker.calls == [(["a"], 3600)]
    finally:
        await keeper.stop()


async def test_stop_returns_when_it_meets_a_wake_up():
    # asyncio.wait_for swallowed a cancel that arrived with the wake-up (Python < 3.12): stop()
    # then waited for the keeper's task for ever, and the stream's aclose with it.
    keeper = LeaseKeeper(RecordingBroker().extend, lease_seconds=3600, max_hold_seconds=7200)
    for _ in range(20):
        keeper.start()
        await asyncio.sleep(0)
        keeper.renew_within(3000)  # wakes the keeper; it plans again and goes back to sleep
        stopping = asyncio.ensure_future(keeper.stop())
        done, _ = await asyncio.wait([stopping], timeout=5)
        assert done, "stop() did not return: the keeper's task swallowed its cancel"
