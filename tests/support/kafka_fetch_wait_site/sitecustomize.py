"""
Test support only: in a child process of the test suite with ``SHARED_STREAM_TEST_KAFKA_FETCH_WAIT=1``
and this directory on ``PYTHONPATH``, install ``tests/support/kafka_fetch_wait.py`` (noida-db holds
an empty Fetch as Kafka does) as soon as ``aiokafka.client`` is imported, and not before.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path
from typing import Any

SHIM = Path(__file__).resolve().parent.parent / "kafka_fetch_wait.py"


def _load_shim() -> Any:
    name = "_shared_stream_kafka_fetch_wait"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, SHIM)
        assert spec is not None
        assert spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


class _AfterAiokafkaClient:
    """A meta path finder that installs the shim right after ``aiokafka.client`` executes."""

    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        if name != "aiokafka.client":
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None:
            return spec
        loader = spec.loader
        exec_module = loader.exec_module

        def exec_then_install(module: Any) -> None:
            exec_module(module)
            try:
                _load_shim().install()
            except Exception as exc:  # an aiokafka unlike ours (another venv): run it unchanged
                print(f"kafka_fetch_wait not installed: {exc!r}", file=sys.stderr)

        loader.exec_module = exec_then_install  # type: ignore[method-assign]
        return spec


if os.environ.get("SHARED_STREAM_TEST_KAFKA_FETCH_WAIT") == "1":
    if "aiokafka.client" in sys.modules:
        _load_shim().install()
    else:
        sys.meta_path.insert(0, _AfterAiokafkaClient())
