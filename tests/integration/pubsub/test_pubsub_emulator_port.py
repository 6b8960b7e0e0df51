"""
The session's emulator serves its own port, or it is started again on another one.

``test_pubsub_outage.py`` freezes the emulator by PID. Once in a CI run on four xdist workers it
saw acknowledgements accepted while "frozen": the port ``free_port()`` had picked was taken by
another process before the JVM bound it, and that process answered every call
(tests/support/ports.py). Here a listener of another process holds the port first.
"""

from __future__ import annotations

import socket
import tempfile
from pathlib import Path

import pytest

from tests.support import pubsub_emulator
from tests.support.ports import port_ownership
from tests.support.processes import free_port
from tests.support.pubsub_emulator import pubsub_emulator_process

pytestmark = pytest.mark.integration


def test_an_emulator_whose_port_another_process_took_starts_on_another_port(monkeypatch):
    with socket.socket() as taken:
        taken.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)  # as a gRPC server of Python does
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        taken_port = taken.getsockname()[1]
        picks = iter([taken_port])
        monkeypatch.setattr(pubsub_emulator, "free_port", lambda: next(picks, None) or free_port())
        with pubsub_emulator_process(Path(tempfile.mkdtemp(prefix="pubsub-emulator-port-"))) as emulator:
            assert emulator.port != taken_port
            port_ownership(emulator.port, emulator.pid or 0).check("the emulator")
            assert emulator.create_topic().startswith(f"projects/{emulator.project}/topics/")  # it answers
