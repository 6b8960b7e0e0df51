"""
A throwaway virtualenv holding this checkout beside other providers, as a deployment would.

Built with uv (installed in .venv by scripts/bootstrap.sh) and pinned to .venv's own versions,
so everything but the extra providers comes from uv's cache and the suite's Airflow and SDKs
are the ones under test.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Collection, Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def run(*args: str, env: dict[str, str] | None = None, timeout: float = 300) -> str:
    result = subprocess.run(args, capture_output=True, text=True, timeout=timeout, env=env)
    assert result.returncode == 0, (
        f"{' '.join(args)} failed:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    )
    return result.stdout


def pinned_constraints(work: Path, unpinned: Collection[str] = ()) -> Path:
    """
    A constraints file in ``work`` pinning every distribution to .venv's version, so a throwaway
    venv runs the Airflow and SDKs under test; but ``unpinned`` and this checkout (editable lines
    are not constraints).
    """
    frozen = run(sys.executable, "-m", "uv", "pip", "freeze", "--python", sys.executable)
    constraints = work / "constraints.txt"
    constraints.write_text(
        "".join(
            line + "\n"
            for line in frozen.splitlines()
            if not line.startswith("-e ") and line.split("==")[0].lower() not in unpinned
        )
    )
    return constraints


def deployment_venv(
    work: Path, extras: str, packages: Sequence[str], *, unpinned: Collection[str] = ()
) -> Path:
    """
    Install this checkout (editable, with ``extras``) and ``packages`` into a new venv in ``work``.

    ``unpinned``: distributions whose .venv version the added packages cannot use (their
    resolver picks another); every other distribution keeps .venv's version. Returns its python.
    """
    uv = [sys.executable, "-m", "uv"]
    constraints = pinned_constraints(work, unpinned)
    venv = work / "venv"
    run(*uv, "venv", "--quiet", "--python", sys.executable, str(venv))
    python = venv / "bin" / "python"
    run(
        *uv,
        "pip",
        "install",
        "--quiet",
        "--python",
        str(python),
        "--constraints",
        str(constraints),
        "--editable",
        f"{ROOT}[{extras}]",
        *packages,
        timeout=900,
    )
    return python
