"""A real HTTP proxy on loopback: fails the first N requests with 503, then forwards (optionally slowly)."""

from __future__ import annotations

import http.client
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from tests.support.processes import free_port


class FlakyProxy:
    """
    Forward to ``127.0.0.1:target_port`` after answering the first ``fail_first`` requests 503.

    For testing a client's transient-error tolerance against a real server (headers, including
    ``Authorization``, are passed through untouched).
    """

    def __init__(
        self, target_port: int, fail_first: int = 0, slow_answers: dict[str, float] | None = None
    ) -> None:
        self.target_port = target_port
        self.fail_first = fail_first
        self.slow_answers = dict(slow_answers or {})
        """Path prefix -> seconds to hold the answer AFTER the target handled the request."""
        self.failed = 0
        self.forwarded = 0
        self.port = free_port()
        self._lock = threading.Lock()
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            def _handle(self) -> None:
                with proxy._lock:
                    fail = proxy.failed < proxy.fail_first
                    if fail:
                        proxy.failed += 1
                    else:
                        proxy.forwarded += 1
                if fail:
                    self.send_response(503)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else None
                conn = http.client.HTTPConnection("127.0.0.1", proxy.target_port, timeout=30)
                headers = {k: v for k, v in self.headers.items() if k.lower() not in ("host", "connection")}
                conn.request(self.command, self.path, body=body, headers=headers)
                resp = conn.getresponse()
                data = resp.read()
                delay = next((s for p, s in proxy.slow_answers.items() if self.path.startswith(p)), 0.0)
                if delay:
                    # The target has acted; the client times out before it hears about it.
                    time.sleep(delay)
                self.send_response(resp.status)
                for key, value in resp.getheaders():
                    if key.lower() not in ("transfer-encoding", "connection", "content-length"):
                        self.send_header(key, value)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
                conn.close()

            do_GET = _handle
            do_POST = _handle

            def log_message(self, format: str, *args: object) -> None:  # quiet
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def __enter__(self) -> FlakyProxy:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(5)
