"""The short form of scripts/mutants.py: two deliberate bugs the contract suite must catch."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[3]


@pytest.mark.timeout(900)
def test_the_contract_suite_catches_the_short_list_of_mutants():
    result = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "mutants.py"), "--short"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=880,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "all 2 mutant(s) caught" in result.stdout
