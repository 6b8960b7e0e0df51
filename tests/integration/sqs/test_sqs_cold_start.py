"""
A stream that starts in a triggerer whose broker SDK is not imported yet imports it off the event
loop (issue 50): the first import of aiobotocore, botocore and aiohttp (hundreds of modules) held
the triggerer's loop for seconds on a loaded machine. Checked in a fresh interpreter, where the
SDK really is cold, against moto: which SDK modules the loop's own thread imported.
"""

from __future__ import annotations

import pytest

from tests.support.brokers import SqsServer
from tests.support.cold_probe import run_cold_probe

pytestmark = pytest.mark.integration


def test_a_cold_stream_imports_its_sdk_off_the_event_loop(sqs: SqsServer) -> None:
    found = run_cold_probe("tests.support.cold_start_probe", sqs)
    assert found["imported_on_the_loop"] == [], (
        f"{len(found['imported_on_the_loop'])} SDK modules imported on the loop's thread, first "
        f"{found['imported_on_the_loop'][:5]}"
    )


def test_a_cold_stream_builds_airflows_metrics_registry_off_the_event_loop(sqs: SqsServer) -> None:
    """
    Airflow parses its YAML list of metrics on a process's first metric: a third of a second
    on the loop at a stream's start on a loaded machine. The stream builds it in a worker thread.
    """
    found = run_cold_probe("tests.support.cold_start_probe", sqs)
    assert found["metrics_registry_built"], "the stream sent no metric and built no registry"
    assert found["metrics_registry_on_the_loop"] == [], "the metrics registry was built on the loop"
