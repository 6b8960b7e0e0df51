"""The registry that refuses a ``reject`` on a stream with nowhere to dead-letter (pure logic)."""

from __future__ import annotations

import pytest

from airflow_shared_stream.common.reject_routes import RejectRoutes, RejectWithNowhereToGoError

FIX = "Configure a dead-letter destination."


def test_a_watcher_that_rejects_joining_a_stream_with_nowhere_to_go_is_refused_alone():
    routes = RejectRoutes()
    producer = object()
    routes.opened("s", producer, None, fix=FIX)
    expected = r"trigger 2 has a reject expression.*Configure"
    with (
        routes.watching("s", "trigger 1", rejects=False, fix=FIX),
        pytest.raises(RejectWithNowhereToGoError, match=expected),
        routes.watching("s", "trigger 2", rejects=True, fix=FIX),
    ):
        pass


def test_watchers_that_reject_before_the_stream_connects_make_it_fail_naming_them():
    routes = RejectRoutes()
    with (
        routes.watching("s", "trigger 2", rejects=True, fix=FIX),
        routes.watching("s", "trigger 1", rejects=False, fix=FIX),
        pytest.raises(RejectWithNowhereToGoError, match=r"^trigger 2 of stream s reject"),
    ):
        routes.opened("s", object(), None, fix=FIX)


def test_a_stream_with_a_destination_runs_watchers_that_reject():
    routes = RejectRoutes()
    with routes.watching("s", "trigger 1", rejects=True, fix=FIX):
        routes.opened("s", object(), "projects/p/topics/dlq", fix=FIX)
        with routes.watching("s", "trigger 2", rejects=True, fix=FIX):
            pass


def test_only_the_producer_that_reported_a_route_clears_it():
    routes = RejectRoutes()
    old, new = object(), object()
    routes.opened("s", old, "projects/p/topics/dlq", fix=FIX)
    routes.opened("s", new, None, fix=FIX)  # a new group of the stream, while the old one closes
    routes.closed("s", old)
    with (
        pytest.raises(RejectWithNowhereToGoError),
        routes.watching("s", "trigger 3", rejects=True, fix=FIX),
    ):
        pass
    routes.closed("s", new)
    with routes.watching("s", "trigger 3", rejects=True, fix=FIX):  # unknown again: not refused
        pass
    assert routes._streams == {}
