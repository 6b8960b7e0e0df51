"""
A recording HTTP server on loopback that answers like a Spark standalone master.

It serves, on one port, what the provider reads from a master and its worker:

* the REST submission server (``/v1/submissions/create|status|kill``), refusing a missing or
  wrong ``Authorization: Bearer`` with HTTP 403 as ``JWSFilter`` does;
* the master web UI's JSON state (``/json/``: workers, active and completed drivers);
* a worker web UI's log page (``/log/?driverId=...&logType=stdout|stderr``).

Every request is recorded (method, path, whether and which ``Authorization`` it carried), so a
test can prove where a credential went, and the benchmark can count requests to the master
without trusting the client. Drivers are plain data: a state, and optionally the time at which
they finish (so thousands of drivers can end on a schedule without any process running them).

It is deliberately small (asyncio streams, HTTP/1.1 keep-alive, no framework) so that one core
can serve thousands of requests per second: the benchmark measures the client, not this server.
Run it in a thread (:meth:`FakeSparkMaster.start`) or as a process::

    python -m tests.support.fake_spark_master --port P --token T --drivers drivers.json
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs, urlsplit

WORKER_ID = "worker-fake-127.0.0.1-1"


@dataclass
class FakeDriver:
    """One driver as the master knows it."""

    state: str = "RUNNING"
    finish_at: float | None = None
    """Unix time at which the driver ends with ``final_state`` (``None``: stays in ``state``)."""
    final_state: str = "FINISHED"
    message: str | None = None
    stdout: str = ""
    stderr: str = ""

    def state_at(self, now: float) -> str:
        if self.finish_at is not None and now >= self.finish_at and self.state in ("SUBMITTED", "RUNNING"):
            return self.final_state
        return self.state


def launch_command(create_body: bytes) -> str:
    """
    The first line a real worker writes to a driver's stderr: its java command, with every Spark
    property of the create request as ``"-D<key>=<value>"`` (what the operator's tag lookup and the
    orphan check read back).
    """
    try:
        properties = json.loads(create_body or b"{}").get("sparkProperties") or {}
    except ValueError:
        properties = {}
    options = " ".join(f'"-D{key}={value}"' for key, value in properties.items())
    return f'Launch Command: "java" "-cp" "/opt/spark/conf/:/opt/spark/jars/*" "-Xmx1024M" {options} ' + (
        '"org.apache.spark.deploy.worker.DriverWrapper"\n========================================\n\n'
    )


@dataclass(frozen=True)
class RecordedRequest:
    method: str
    path: str
    authorization: str | None


@dataclass
class FakeSparkMaster:
    """The server's state; :meth:`serve` runs it on the current event loop."""

    token: str | None = None
    drivers: dict[str, FakeDriver] = field(default_factory=dict)
    record_requests: bool = True
    response_delay: dict[str, float] = field(default_factory=dict)
    """Seconds to wait before answering a request whose path starts with the key (after acting)."""
    fail_next: dict[str, int] = field(default_factory=dict)
    """Path prefix -> how many of the next requests to it are answered HTTP 503."""
    listing_status: int = 200
    """HTTP status of ``/json/`` (e.g. 403 for a web UI behind an authentication filter)."""
    requests: list[RecordedRequest] = field(default_factory=list)
    counts: Counter = field(default_factory=Counter)
    port: int = 0
    _ids: itertools.count = field(default_factory=lambda: itertools.count(1))
    _thread: threading.Thread | None = None
    _loop: asyncio.AbstractEventLoop | None = None
    _server: asyncio.base_events.Server | None = None

    # -- addresses ---------------------------------------------------------------------------

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def connection(self, **extra: object) -> dict[str, object]:
        """An Airflow Connection (JSON form) whose REST port and master UI are this server."""
        return {
            "conn_type": "spark",
            "host": "spark://127.0.0.1",
            "port": 7,
            "password": self.token,
            "extra": {"deploy-mode": "cluster", "rest-port": self.port, "master-ui-url": self.url, **extra},
        }

    # -- what the master answers -------------------------------------------------------------

    def master_state(self, now: float | None = None) -> dict[str, Any]:
        now = time.time() if now is None else now
        active, completed = [], []
        for driver_id, driver in self.drivers.items():
            state = driver.state_at(now)
            entry = {
                "id": driver_id,
                "starttime": "0",
                "state": state,
                "cores": 1,
                "memory": 1024,
                "resources": {},
                "submitdate": "",
                "worker": WORKER_ID,
                "mainclass": "org.apache.spark.deploy.PythonRunner",
            }
            (active if state in ("SUBMITTED", "RUNNING", "RELAUNCHING", "UNKNOWN") else completed).append(
                entry
            )
        return {
            "url": "spark://127.0.0.1:7",
            "workers": [{"id": WORKER_ID, "webuiaddress": self.url, "state": "ALIVE"}],
            "activedrivers": active,
            "completeddrivers": completed,
            "status": "ALIVE",
        }

    def _rest(self, method: str, path: str, body: bytes) -> tuple[int, dict[str, Any]]:
        parts = path.strip("/").split("/")
        if method == "POST" and parts[:3] == ["v1", "submissions", "create"]:
            driver_id = f"driver-20260101000000-{next(self._ids):04d}"
            self.drivers[driver_id] = FakeDriver(state="RUNNING", stderr=launch_command(body))
            return 200, {"action": "CreateSubmissionResponse", "success": True, "submissionId": driver_id}
        if len(parts) != 4 or parts[:2] != ["v1", "submissions"]:
            return 404, {"action": "ErrorResponse", "success": False, "message": "no such endpoint"}
        driver_id = parts[3]
        driver = self.drivers.get(driver_id)
        if method == "GET" and parts[2] == "status":
            if driver is None:
                return 200, {
                    "action": "SubmissionStatusResponse",
                    "success": False,
                    "submissionId": driver_id,
                }
            answer = {
                "action": "SubmissionStatusResponse",
                "success": True,
                "submissionId": driver_id,
                "driverState": driver.state_at(time.time()),
                "workerId": WORKER_ID,
                "workerHostPort": f"127.0.0.1:{self.port}",
            }
            if driver.message:
                answer["message"] = driver.message
            return 200, answer
        if method == "POST" and parts[2] == "kill":
            if driver is None or driver.state_at(time.time()) not in ("SUBMITTED", "RUNNING"):
                return 200, {"action": "KillSubmissionResponse", "success": False, "submissionId": driver_id}
            driver.state, driver.finish_at = "KILLED", None
            return 200, {"action": "KillSubmissionResponse", "success": True, "submissionId": driver_id}
        return 404, {"action": "ErrorResponse", "success": False, "message": "no such endpoint"}

    def _answer(self, method: str, target: str, auth: str | None, body: bytes) -> tuple[int, str, bytes]:
        split = urlsplit(target)
        path = split.path
        if not path.startswith("/__"):  # control requests are not requests to the master
            self.counts[path.rstrip("/").split("/")[-2] if path.startswith("/v1/") else path] += 1
            self.counts["total"] += 1
        if self.record_requests:
            self.requests.append(RecordedRequest(method, target, auth))
        failing = next((p for p, n in self.fail_next.items() if n > 0 and path.startswith(p)), None)
        if failing is not None:
            self.fail_next[failing] -= 1
            return 503, "text/plain", b"unavailable"
        if path.startswith("/v1/"):
            if self.token is not None and auth != f"Bearer {self.token}":
                return 403, "text/html", b"<html>403 Forbidden</html>"
            status, data = self._rest(method, path, body)
            return status, "application/json", json.dumps(data).encode()
        if path == "/json/" and self.listing_status != 200:
            return self.listing_status, "text/html", b"<html>refused</html>"
        if path == "/json/":
            return 200, "application/json", json.dumps(self.master_state()).encode()
        if path == "/log/":
            query = parse_qs(split.query)
            driver = self.drivers.get(query.get("driverId", [""])[0])
            if driver is None:
                return 404, "text/plain", b""
            text = driver.stdout if query.get("logType", [""])[0] == "stdout" else driver.stderr
            return 200, "text/plain", text.encode()
        if path == "/__schedule" and method == "POST":
            # Benchmark control: every RUNNING driver finishes at start + spread * i / n.
            plan = json.loads(body or b"{}")
            running = sorted(d for d, v in self.drivers.items() if v.state == "RUNNING")
            finishes = {}
            for i, driver_id in enumerate(running):
                at = float(plan["start"]) + float(plan["spread"]) * i / max(len(running), 1)
                self.drivers[driver_id].finish_at = finishes[driver_id] = at
            return 200, "application/json", json.dumps(finishes).encode()
        if path == "/__stats":
            return 200, "application/json", json.dumps(dict(self.counts)).encode()
        return 404, "text/plain", b"not found"

    # -- HTTP --------------------------------------------------------------------------------

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                lines = head.decode("latin-1").split("\r\n")
                method, target, _ = lines[0].split(" ", 2)
                headers = {}
                for line in lines[1:]:
                    if ":" in line:
                        key, value = line.split(":", 1)
                        headers[key.strip().lower()] = value.strip()
                length = int(headers.get("content-length") or 0)
                body = await reader.readexactly(length) if length else b""
                status, ctype, payload = self._answer(method, target, headers.get("authorization"), body)
                delay = next((s for p, s in self.response_delay.items() if target.startswith(p)), 0.0)
                if delay:
                    await asyncio.sleep(delay)
                head = (
                    f"HTTP/1.1 {status} X\r\nContent-Type: {ctype}\r\nContent-Length: {len(payload)}\r\n\r\n"
                )
                writer.write(head.encode() + payload)
                await writer.drain()
                if headers.get("connection", "").lower() == "close":
                    break
        except (asyncio.IncompleteReadError, ConnectionError, ValueError, asyncio.CancelledError):
            pass
        finally:
            writer.close()

    async def serve(self, port: int = 0) -> asyncio.base_events.Server:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", port, backlog=4096)
        self.port = self._server.sockets[0].getsockname()[1]
        return self._server

    def start(self) -> FakeSparkMaster:
        """Serve from a daemon thread with its own event loop (for tests)."""
        ready = threading.Event()

        def run() -> None:
            self._loop = loop = asyncio.new_event_loop()
            loop.run_until_complete(self.serve())
            ready.set()
            loop.run_forever()
            loop.close()

        self._thread = threading.Thread(target=run, name="fake-spark-master", daemon=True)
        self._thread.start()
        if not ready.wait(10):
            raise RuntimeError("fake Spark master did not start")
        return self

    async def _shutdown(self) -> None:
        if self._server is not None:
            self._server.close()
        handlers = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for task in handlers:  # open keep-alive connections
            task.cancel()
        await asyncio.gather(*handlers, return_exceptions=True)
        asyncio.get_running_loop().stop()

    def stop(self) -> None:
        if self._loop is not None:
            asyncio.run_coroutine_threadsafe(self._shutdown(), self._loop)
        if self._thread is not None:
            self._thread.join(10)

    def __enter__(self) -> FakeSparkMaster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description="A fake Spark standalone master on loopback")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--token", default=None)
    parser.add_argument("--drivers", required=True, help="JSON file: {id: {state, finish_at, ...}}")
    args = parser.parse_args()
    with open(args.drivers) as f:
        drivers = {k: FakeDriver(**v) for k, v in json.load(f).items()}
    master = FakeSparkMaster(token=args.token, drivers=drivers, record_requests=False)

    async def run() -> None:
        server = await master.serve(args.port)
        print(f"listening {master.port}", flush=True)
        async with server:
            await server.serve_forever()

    asyncio.run(run())


if __name__ == "__main__":
    main()
