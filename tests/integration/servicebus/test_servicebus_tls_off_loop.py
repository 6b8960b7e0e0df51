"""
No Service Bus connection loads CA certificates on the triggerer's event loop (issue 50, class 13).

azure-servicebus builds a TLS context for each AMQP connection and loads certifi's CA bundle into
it on the loop, unless the client is given a context; a stream opens a connection for its
receiver and for each session it takes. The stream's clients get one context, built once in a
worker thread (``servicebus.tls``). The check is an event, not a timing: every CA load of the run
is recorded with the thread it ran on.
"""

from __future__ import annotations

import ssl
import threading
from collections.abc import Iterator

import pytest

from airflow_shared_stream.servicebus import ServiceBusSharedStreamTrigger
from airflow_shared_stream.servicebus.tls import tls_context

pytestmark = pytest.mark.integration


@pytest.fixture
def ca_loads(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """The thread name of every CA bundle load into an ``ssl.SSLContext`` from now on."""
    threads: list[str] = []
    for method in ("load_verify_locations", "load_default_certs"):
        original = getattr(ssl.SSLContext, method)

        def recording(self, *args, _original=original, **kwargs):  # type: ignore[no-untyped-def]
            threads.append(threading.current_thread().name)
            return _original(self, *args, **kwargs)

        monkeypatch.setattr(ssl.SSLContext, method, recording)
    tls_context.cache_clear()  # this process may have built it in an earlier test
    yield threads
    tls_context.cache_clear()


async def test_a_stream_with_sessions_loads_no_ca_bundle_on_the_event_loop(
    servicebus, servicebus_connection, harness, ca_loads
) -> None:
    queue = servicebus.create_queue(requires_session=True)
    watcher = harness.add(
        ServiceBusSharedStreamTrigger(
            queue, azure_service_bus_conn_id=servicebus_connection, session_enabled=True
        )
    )
    sent = servicebus.send(queue, [{"n": i} for i in range(6)], session_id=lambda i: "abc"[i % 3])
    await watcher.wait_for_events(len(sent), timeout=60)
    loop_thread = threading.current_thread().name
    assert ca_loads, "the stream's TLS context was never built: the check would prove nothing"
    assert loop_thread not in ca_loads, f"CA certificates loaded on the event loop's thread: {ca_loads}"
