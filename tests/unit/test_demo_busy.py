"""
``scripts/demo.sh --busy N`` runs N processes spinning a core each for the demo's duration, and
stops them however the demo ends: a spinner left behind would load the machine for good.

The demo's ``main`` is driven for real up to its broker's start, which is replaced by a stand-in
that sees the spinners running and then fails or is interrupted (Ctrl-C).
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.machine_load import busy_processes

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"


@pytest.fixture
def demo(monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.syspath_prepend(str(SCRIPTS))
    monkeypatch.setattr("signal.signal", lambda *args: None)  # main's SIGTERM handler: not in pytest
    sys.modules.pop("demo", None)
    import demo

    yield demo
    sys.modules.pop("demo", None)


@pytest.mark.parametrize("ending", [KeyboardInterrupt("Ctrl-C"), RuntimeError("the broker did not start")])
def test_the_busy_processes_run_during_the_demo_and_stop_when_it_fails(
    demo: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, ending: BaseException
) -> None:
    started: list[Any] = []

    @contextlib.contextmanager
    def recording(count: int) -> Iterator[list[Any]]:
        with busy_processes(count) as spinners:
            started.extend(spinners)
            yield spinners

    running_when_the_broker_starts: list[bool] = []

    def broker(*args: Any, **kwargs: Any) -> Any:
        running_when_the_broker_starts.extend(spinner.poll() is None for spinner in started)
        raise ending

    monkeypatch.setattr(demo, "busy_processes", recording)
    monkeypatch.setattr(demo, "kafka_broker_process", broker)
    with pytest.raises(type(ending)):
        demo.main(["--busy", "2", "--work-dir", str(tmp_path / "work")])
    assert running_when_the_broker_starts == [True, True]
    assert [spinner.poll() for spinner in started] == [-9, -9], "every spinner was killed and reaped"


def test_a_spinner_that_cannot_start_stops_the_ones_already_started(monkeypatch: pytest.MonkeyPatch) -> None:
    import subprocess

    real_popen = subprocess.Popen
    made: list[Any] = []

    def popen(*args: Any, **kwargs: Any) -> Any:
        if made:
            raise OSError("no more processes")
        made.append(real_popen(*args, **kwargs))
        return made[-1]

    monkeypatch.setattr(subprocess, "Popen", popen)
    with pytest.raises(OSError, match="no more processes"), busy_processes(3):
        pass
    assert [spinner.poll() for spinner in made] == [-9]


def test_without_busy_the_demo_starts_no_spinner(demo: Any) -> None:
    assert demo._parse([]).busy == 0
