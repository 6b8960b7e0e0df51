"""
The TLS context every Service Bus connection of a process uses: built once, off the event loop.

azure-servicebus's AMQP transport builds an ``ssl.SSLContext`` for each connection it opens and
loads certifi's CA bundle into it (``_build_ssl_opts``), synchronously, on the event loop: the
certificate parsing held the triggerer's loop for tens of milliseconds per connection on an idle
machine, several times that under load, and a stream opens a connection for its receiver, for
each session it takes and for each redrive (docs/benchmarks.rst, "Stream start-up"). Given a
context (the client's ``ssl_context``), the SDK uses it as it is. This one is the context the SDK
would build (``PROTOCOL_TLS_CLIENT``: the host name checked, a certificate required, certifi's
CAs), built in a worker thread when a client's configuration is read.
"""

from __future__ import annotations

import functools
import ssl


@functools.lru_cache(maxsize=1)
def tls_context() -> ssl.SSLContext:
    """The SDK's own default context, built once per process (call it off the loop first)."""
    import certifi

    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.load_verify_locations(certifi.where())
    return context
