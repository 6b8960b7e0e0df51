"""
``scripts/demo.sh`` keeps its work directory, with every log, when a run fails.

A failed demo run is the one whose logs say why (one run on a loaded machine ended "spark_submit
wrote 0 rows" with nothing left to look at). These tests drive ``scripts/demo.py``'s ``main``
with its pipeline replaced by a stand-in that writes logs into the work directory and then
fails, raises or succeeds: the part under test is what ``main`` does with the directory after.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"


@pytest.fixture
def demo(monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.syspath_prepend(str(SCRIPTS))
    monkeypatch.setattr("signal.signal", lambda *args: None)  # main's SIGTERM handler: not in pytest
    sys.modules.pop("demo", None)
    import demo

    yield demo
    sys.modules.pop("demo", None)


@pytest.fixture
def runs_in(demo: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> list[Path]:
    """The demo's fresh temporary work directory, made under ``tmp_path`` (the list gets it)."""
    made: list[Path] = []

    def mkdtemp(prefix: str) -> str:
        work = tmp_path / f"{prefix}{len(made)}"
        work.mkdir()
        made.append(work)
        return str(work)

    monkeypatch.setattr(demo.tempfile, "mkdtemp", mkdtemp)
    return made


def _pipeline_writing_logs(outcome: list[str] | BaseException) -> Any:
    def run(args: Any, work: Path) -> list[str]:
        (work / "airflow" / "process-logs").mkdir(parents=True)
        (work / "airflow" / "process-logs" / "triggerer.log").write_text("triggerer said why\n")
        (work / "spark" / "logs").mkdir(parents=True)
        (work / "spark" / "logs" / "master.log").write_text("master said why\n")
        (work / "spark" / "work" / "driver-1").mkdir(parents=True)
        (work / "spark" / "work" / "driver-1" / "stderr").write_text("the driver said why\n")
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome

    return run


def test_a_failed_run_keeps_its_work_directory_and_names_its_logs(
    demo: Any, runs_in: list[Path], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(demo, "_run", _pipeline_writing_logs(["spark_submit wrote 0 rows for 23 expected"]))

    assert demo.main([]) == 1

    [work] = runs_in
    out = capsys.readouterr().out
    assert (work / "airflow" / "process-logs" / "triggerer.log").read_text() == "triggerer said why\n"
    assert f"kept, with every log of this run: {work}" in out
    assert str(work / "airflow" / "process-logs" / "triggerer.log") in out
    assert str(work / "spark" / "logs" / "master.log") in out
    assert str(work / "spark" / "work" / "driver-1" / "stderr") in out
    assert "FAILED: spark_submit wrote 0 rows for 23 expected" in out


def test_a_run_that_raises_keeps_its_work_directory(
    demo: Any, runs_in: list[Path], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(demo, "_run", _pipeline_writing_logs(RuntimeError("Spark master did not start")))

    with pytest.raises(RuntimeError, match="Spark master did not start"):
        demo.main([])

    [work] = runs_in
    assert (work / "spark" / "logs" / "master.log").exists()
    assert f"kept, with every log of this run: {work}" in capsys.readouterr().out


def test_a_successful_run_removes_its_temporary_work_directory(
    demo: Any, runs_in: list[Path], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(demo, "_run", _pipeline_writing_logs([]))

    assert demo.main([]) == 0

    [work] = runs_in
    assert not work.exists()
    assert "kept" not in capsys.readouterr().out


def test_a_work_directory_the_user_named_stays_after_success(
    demo: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(demo, "_run", _pipeline_writing_logs([]))

    assert demo.main(["--work-dir", str(tmp_path / "mine")]) == 0

    assert (tmp_path / "mine" / "spark" / "logs" / "master.log").exists()
