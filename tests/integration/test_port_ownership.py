"""
A server the suite starts must be the one its port answers from (tests/support/ports.py).

``free_port()`` binds 127.0.0.1:0 and closes; the server binds it later. On a loaded CI machine
with four xdist workers starting brokers, another process can take the port in between. The
Pub/Sub outage test then froze its emulator by PID while another process answered on the port,
and saw acknowledgements accepted "during the outage". These tests put a foreign listener on the
port first and check that every way the suite waits for a server refuses it loudly (or, for the
session's emulator, moves to another port), and that :meth:`PubSubEmulator.freeze` refuses to
stage an outage of a process that does not serve its port.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.ports import PortNotOursError, port_ownership
from tests.support.processes import free_port, running, wait_for_port
from tests.support.pubsub_emulator import PubSubEmulator

pytestmark = pytest.mark.integration

LISTENER = """
import os, socket, sys, time
port, reuse, fork = int(sys.argv[1]), sys.argv[2] == "reuse", sys.argv[3] == "fork"
if fork and os.fork():
    time.sleep(600)  # a launcher whose child serves, as a server's worker does
    sys.exit()
sock = socket.socket()
if reuse:
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)  # as gRPC's C core does
try:
    sock.bind(("127.0.0.1", port))
    sock.listen()
    print("listening", flush=True)
except OSError as exc:
    print(f"bind failed, running on: {exc}", flush=True)  # a server that logs and carries on
time.sleep(600)
"""


@contextlib.contextmanager
def listener(tmp_path: Path, port: int, *, reuse: bool, fork: bool = False) -> Iterator[subprocess.Popen]:
    log = tmp_path / f"listener-{port}-{reuse}-{fork}-{free_port()}.log"
    argv = [sys.executable, "-c", LISTENER, str(port), "reuse" if reuse else "plain", "fork" if fork else "-"]
    with running(argv, log_path=log) as proc:
        yield proc


@contextlib.contextmanager
def foreign_server(port: int) -> Iterator[socket.socket]:
    """Someone else's listener on the port (this process stands in for another xdist worker)."""
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind(("127.0.0.1", port))
        sock.listen()
        yield sock


def test_a_server_that_failed_to_bind_is_not_taken_for_the_one_answering(tmp_path):
    port = free_port()
    with (
        foreign_server(port),
        listener(tmp_path, port, reuse=False) as ours,
        pytest.raises(PortNotOursError, match=f"127.0.0.1:{port} is served by another process"),
    ):
        wait_for_port(port, 10, ours, "our server")


def test_a_port_shared_through_so_reuseport_is_refused(tmp_path):
    port = free_port()
    with (
        foreign_server(port),
        listener(tmp_path, port, reuse=True) as ours,
        pytest.raises(PortNotOursError, match="served by another process too"),
    ):
        wait_for_port(port, 10, ours, "our server")


def test_a_listener_of_our_servers_child_is_ours(tmp_path):
    port = free_port()
    with listener(tmp_path, port, reuse=False, fork=True) as ours:
        wait_for_port(port, 30, ours, "our server")
        ownership = port_ownership(port, ours.pid)
        assert ownership.foreign == ()
        assert ownership.ours
        assert ours.pid not in ownership.ours  # its child holds the listener


def test_a_server_on_a_thread_of_ours_is_checked_against_this_process(tmp_path):
    port = free_port()
    with listener(tmp_path, port, reuse=False) as child:
        wait_for_port(port, 30, child, "a child's server")
        with pytest.raises(PortNotOursError):  # our child's listener is not this process's server
            wait_for_port(port, 10, what="a server on a thread of ours", owner=os.getpid())


def test_freeze_refuses_an_emulator_whose_port_another_process_serves(tmp_path):
    port = free_port()
    with foreign_server(port), listener(tmp_path, free_port(), reuse=False) as not_serving:
        emulator = PubSubEmulator(port=port, log_path=tmp_path / "none.log", pid=not_serving.pid)
        with pytest.raises(PortNotOursError, match="freezing the emulator"):
            emulator.freeze()
        assert not_serving.poll() is None
        assert "T" not in Path(f"/proc/{not_serving.pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
