"""
Every local trial of docs/local-trials.rst, walked as a user pastes it.

Each trial's commands are the files the page includes (docs/examples/trials/<broker>.sh and
<broker>_send.py), run as they stand but for the ports: the test gives each broker a free port in
place of the documented one, and nothing else. A trial fails here when a step is missing (the
watcher never fires), when a command fails, or when anything it runs prints a warning (the broker's
own log goes to a file, as the page says). After the commands, ``tests/support/trial_probe.py``
starts the watcher a user's Dag would declare, through Airflow's real shared-stream manager, in
the environment the commands left, and runs the send script until the watcher fires.

``pip install`` lines run with ``PIP_NO_INDEX``: the suite's environment has the packages already,
so pip only checks that the names are right. Service Bus has no local broker a user can install
(Microsoft's emulator is a container image); its trial is the emulator's connection string, which
runs here against the suite's Service Bus test server, signed with the emulator's documented key.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.processes import free_port
from tests.support.servicebus_server import ServiceBusServer

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

ROOT = Path(__file__).resolve().parents[2]
TRIALS = ROOT / "docs" / "examples" / "trials"
PROBE = ROOT / "tests" / "support" / "trial_probe.py"
DOCUMENTED_PORTS = {"sqs": "5000", "kafka": "9092", "pubsub": "8085"}


def localised(name: str, work: Path, replacements: dict[str, str], *, required: bool) -> Path:
    """The documented file with only ``replacements`` made (each must occur if ``required``), in ``work``."""
    text = (TRIALS / name).read_text()
    for documented, local in replacements.items():
        assert documented in text or not required, f"{name} no longer says {documented!r}"
        text = text.replace(documented, local)
    (work / name).write_text(text)
    return work / name


def user_environment(work: Path) -> dict[str, str]:
    """The suite's virtualenv first on PATH; pip offline and without this machine's own config."""
    keep = {k: v for k, v in os.environ.items() if not k.startswith(("AIRFLOW_CONN_", "PUBSUB_", "PYTEST"))}
    return {
        **keep,
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
        "PIP_NO_INDEX": "1",
        "PIP_CONFIG_FILE": os.devnull,
        "PIP_DISABLE_PIP_VERSION_CHECK": "1",
        "HOME": str(work),
    }


@pytest.fixture
def session_group() -> Iterator[list[int]]:
    """Process groups the trials started (their brokers run in the background): killed after."""
    groups: list[int] = []
    yield groups
    for group in groups:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(group, signal.SIGKILL)


def walk(broker: str, work: Path, replacements: dict[str, str], groups: list[int]) -> object:
    script = localised(f"{broker}.sh", work, replacements, required=True)
    sender = localised(f"{broker}_send.py", work, replacements, required=False)
    env_file = work / "environment.json"
    # The page's commands, in one shell, as pasted; then what they left in the environment.
    shell = (
        f"set -eu\n. {script}\n"
        f"python -c 'import json, os; print(json.dumps(dict(os.environ)))' > {env_file}\n"
    )
    commands = subprocess.Popen(
        ["bash", "-c", shell], cwd=work, env=user_environment(work), start_new_session=True,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    groups.append(commands.pid)
    output, _ = commands.communicate(timeout=300)
    assert commands.returncode == 0, output
    assert "warning" not in output.lower(), output
    probe = subprocess.run(
        [sys.executable, "-I", str(PROBE), broker, str(sender)], cwd=work, capture_output=True, text=True,
        env=json.loads(env_file.read_text()), timeout=300,
    )  # fmt: skip
    assert probe.returncode == 0, probe.stdout[-3000:] + probe.stderr[-3000:]
    assert "warning" not in probe.stderr.lower(), probe.stderr[-3000:]
    return json.loads(probe.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("broker", sorted(DOCUMENTED_PORTS))
def test_a_local_trial_reaches_its_first_event(broker: str, tmp_path: Path, session_group: list[int]):
    port = str(free_port())
    payload = walk(broker, tmp_path, {DOCUMENTED_PORTS[broker]: port}, session_group)
    assert payload == {"type": "order_created", "order_id": 1}


def test_the_service_bus_emulator_connection_reaches_its_first_event(
    tmp_path: Path, session_group: list[int]
):
    server = ServiceBusServer(sas_keys={"RootManageSharedAccessKey": "SAS_KEY_VALUE"})
    server.start()
    try:
        server.create_queue("queue.1")
        endpoint = {"Endpoint=sb://localhost;": f"Endpoint=sb://127.0.0.1:{server.port};"}
        payload = walk("servicebus", tmp_path, endpoint, session_group)
    finally:
        server.stop()
    assert payload == {"type": "order_created", "order_id": 1}
