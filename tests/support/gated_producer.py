"""A producer module whose import waits at ``import_gate`` (a slow broker SDK import, held)."""

from __future__ import annotations

from tests.support import import_gate

import_gate.entered.set()
if not import_gate.release.wait(60):
    raise RuntimeError("the test never released the gated producer import")

from airflow_shared_stream.testing import InMemoryProducer as GatedProducer  # noqa: E402

__all__ = ["GatedProducer"]
