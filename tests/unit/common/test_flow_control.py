from __future__ import annotations

import asyncio

import pytest

from airflow_shared_stream.common.errors import SharedStreamConfigurationError
from airflow_shared_stream.common.flow_control import CreditWindow, validate_max_in_flight


async def test_acquire_blocks_when_the_window_is_full_until_a_release():
    window = CreditWindow(2)
    await window.acquire()
    await window.acquire()
    assert window.available == 0
    third = asyncio.create_task(window.acquire())
    await asyncio.sleep(0.01)
    assert not third.done()
    window.release(1)
    await asyncio.wait_for(third, 1)
    assert window.in_flight == 2


async def test_wait_for_credit_reports_how_many_are_free():
    window = CreditWindow(10)
    for _ in range(7):
        await window.acquire()
    assert await window.wait_for_credit() == 3
    window.release(7)
    assert await window.wait_for_credit() == 10


def test_release_never_goes_negative():
    window = CreditWindow(3)
    window.release(5)
    assert window.in_flight == 0
    assert window.available == 3


@pytest.mark.parametrize("bad", [0, -1, 10**6])
def test_max_in_flight_must_fit_the_subscriber_queue(bad):
    with pytest.raises(SharedStreamConfigurationError, match="max_in_flight must be between 1 and 1024"):
        validate_max_in_flight(bad)


@pytest.mark.parametrize("bad", ["10", 1.5, True])
def test_max_in_flight_must_be_an_int(bad):
    with pytest.raises(SharedStreamConfigurationError, match="max_in_flight must be an int"):
        validate_max_in_flight(bad)


def test_max_in_flight_follows_the_configured_queue_size(monkeypatch):
    monkeypatch.setenv("AIRFLOW__TRIGGERER__SHARED_STREAM_SUBSCRIBER_QUEUE_SIZE", "4096")
    assert validate_max_in_flight(3000) == 3000


def test_take_spends_a_free_credit_and_refuses_past_the_window():
    window = CreditWindow(1)
    window.take()
    assert window.available == 0
    with pytest.raises(RuntimeError, match="credit window is full"):
        window.take()


def test_reserved_credits_are_not_available_and_unfilled_ones_come_back():
    window = CreditWindow(10)
    window.reserve(6)
    assert window.available == 4
    assert window.in_flight == 0
    with pytest.raises(RuntimeError):
        window.reserve(5)
    window.receive_reserved(6, 2)
    assert window.in_flight == 2
    assert window.available == 8
    with pytest.raises(RuntimeError):
        window.receive_reserved(1, 2)


async def test_a_waiter_is_woken_after_another_gave_up_waiting():
    """The window wakes only waiting tasks; one that timed out (Kafka's poll) must not be counted."""
    window = CreditWindow(1)
    await window.acquire()
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(window.wait_for_credit(), 0.01)
    assert window._waiters == 0
    window.release(1)  # nobody waits: no wake-up is owed
    await window.acquire()
    waiter = asyncio.create_task(window.wait_for_credit())
    await asyncio.sleep(0.01)
    assert not waiter.done()
    window.release(1)
    assert await asyncio.wait_for(waiter, 1) == 1


async def test_credits_a_receive_did_not_fill_wake_a_waiter():
    window = CreditWindow(4)
    window.reserve(4)
    waiter = asyncio.create_task(window.wait_for_credit())
    await asyncio.sleep(0.01)
    assert not waiter.done()
    window.receive_reserved(4, 1)
    assert await asyncio.wait_for(waiter, 1) == 3
