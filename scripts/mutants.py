#!/usr/bin/env python
"""
Prove the test suite catches the bugs its tests are named after.

Each mutant is one deliberate bug (delete on receipt, no credit window, dead-letter after the
delete, dead-letter skipped when the send fails, one lane per message on an ordered queue, a
lane's received messages not held back behind its redelivery, leases not renewed; for Kafka:
commit on receipt, no credit window, dead-letter fire-and-forget or after the commit,
dead-letter skipped when the send fails, stale records handed out after a seek, the
no-subscriber pause skipped or never lifted; for the MessageQueueTrigger schemes, ``--broker queues``:
a scheme that collides or matches loosely, a URI claimed, our trigger wrapped, unknown arguments
dropped, each naming its own tests; for Spark: the deferrable operator's guarantees, each
caught by its own module's tests). The mutants are data, one ``[[mutant]]`` entry each in
``scripts/mutants.toml`` (its header says what each field means); this script is their runner.
For each, it copies the package and the tests to a temporary directory, applies the mutant
there (the working tree is never touched), runs the tests that must catch it against the real
broker, and checks that they FAIL. A mutant that survives is a hole in the suite: the script
exits non-zero and names it.

Usage::

    .venv/bin/python scripts/mutants.py              # every mutant of every broker
    .venv/bin/python scripts/mutants.py --broker sqs
    .venv/bin/python scripts/mutants.py --short      # the quick subset the test suite runs
    .venv/bin/python scripts/mutants.py --name "in flight"   # the mutants whose name says so
    .venv/bin/python scripts/mutants.py --name "nobody saw"   # the mutants whose name has this

A mutant whose source snippet no longer occurs exactly once fails loudly too: refactor the
code, then update the snippet, so no mutant silently stops being applied.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # the project's floor is 3.10: the same parser, before the standard library took it in
    import tomli as tomllib  # type: ignore[import-not-found,unused-ignore]

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "scripts" / "mutants.toml"
CONTRACT = "tests/integration/{broker}/test_{broker}_contract.py::Test{Broker}Contract::{test}"

SUITE = {"kafka": "Kafka", "sqs": "Sqs", "pubsub": "PubSub", "servicebus": "ServiceBus"}
"""The name of each broker's contract class (``Test<name>Contract``)."""


@dataclass(frozen=True)
class Mutant:
    """One ``[[mutant]]`` entry of the data file."""

    name: str
    broker: str
    guarantee: str
    file: str
    snippet: str
    replacement: str
    tests: tuple[str, ...]
    module: str = ""
    """The test module of ``tests`` when it is not the broker's contract suite."""
    short: bool = False

    def test_ids(self) -> list[str]:
        """Contract tests by name, tests of ``module`` by name, any other test by node id (``path::name``)."""
        broker = self.broker
        if self.module:
            return [test if "::" in test else f"{self.module}::{test}" for test in self.tests]
        return [
            test if "::" in test else CONTRACT.format(broker=broker, Broker=SUITE[broker], test=test)
            for test in self.tests
        ]


REQUIRED = tuple(field.name for field in fields(Mutant) if field.name not in ("module", "short"))
"""The fields every entry states; ``module`` and ``short`` have defaults."""


def mutant(entry: dict[str, Any]) -> Mutant:
    """An entry as a ``Mutant``; ``ValueError`` for one with a field missing, unknown or of the wrong type."""
    label = f"mutant {entry.get('name', entry)!r} in {DATA.name}"
    known = {field.name for field in fields(Mutant)}
    missing = [key for key in REQUIRED if key not in entry]
    unknown = sorted(set(entry) - known)
    if missing or unknown:
        raise ValueError(f"{label}: fields missing {missing}, unknown {unknown}")
    tests = entry["tests"]
    if not isinstance(tests, list) or not all(isinstance(test, str) for test in tests):
        raise ValueError(f"{label}: tests must be a list of test names or node ids")
    if not isinstance(entry.get("short", False), bool):
        raise ValueError(f"{label}: short must be true or false")
    texts = [key for key in known - {"tests", "short"} if key in entry and not isinstance(entry[key], str)]
    if texts:
        raise ValueError(f"{label}: {sorted(texts)} must be strings")
    return Mutant(**{**entry, "tests": tuple(tests)})


def load(path: Path = DATA) -> tuple[Mutant, ...]:
    """Every mutant of the data file, in its order; an entry that is not whole stops the run."""
    with path.open("rb") as data:
        entries = tomllib.load(data)["mutant"]
    try:
        return tuple(mutant(entry) for entry in entries)
    except ValueError as error:
        raise SystemExit(str(error)) from None


def apply(mutant: Mutant, copy: Path) -> None:
    target = copy / mutant.file
    source = target.read_text()
    occurrences = source.count(mutant.snippet)
    if occurrences != 1:
        raise SystemExit(
            f"mutant {mutant.name!r}: its snippet occurs {occurrences} times in {mutant.file} "
            "(expected once): update the mutant to the current code"
        )
    target.write_text(source.replace(mutant.snippet, mutant.replacement))


def run(mutant: Mutant, python: str, timeout: float) -> tuple[bool, str]:
    """Apply ``mutant`` to a fresh copy and run its tests; return (caught, tail of the output)."""
    with tempfile.TemporaryDirectory(prefix="shared-stream-mutant-") as tmp:
        copy = Path(tmp)
        # README, licence files and docs: the install test builds the wheel and parses docs/examples.
        copied = (
            "airflow_shared_stream",
            "tests",
            "docs",
            "pyproject.toml",
            "README.md",
            "LICENSE",
            "NOTICE",
            "scripts",
            # The docs build includes the result tables, the example Dags, provider.yaml's
            # settings and the changelog.
            "bench",
            "example_dags",
            "provider.yaml",
            "CHANGELOG.rst",
        )

        for item in copied:
            source = ROOT / item
            if source.is_dir():
                shutil.copytree(source, copy / item, ignore=shutil.ignore_patterns("__pycache__"))
            else:
                shutil.copy2(source, copy / item)
        apply(mutant, copy)
        env = {**os.environ, "PYTHONPATH": str(copy)}
        env.pop("SHARED_STREAM_DOCS_HTML", None)  # scripts/test.sh's build is of the unmutated docs
        probe = subprocess.run(
            [python, "-c", "import airflow_shared_stream; print(airflow_shared_stream.__file__)"],
            cwd=copy,
            env=env,
            capture_output=True,
            text=True,
            check=True,
        )
        if not probe.stdout.strip().startswith(str(copy)):
            raise SystemExit(f"the copy is not what gets imported: {probe.stdout.strip()}")
        result = subprocess.run(
            [python, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-x", *mutant.test_ids()],
            cwd=copy,
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        lines = result.stdout.strip().splitlines()
        reason = next((line.strip() for line in lines if line.startswith("E ")), "")
        tail = "\n".join([reason, *lines[-1:]])
        # Exit code 1: tests ran and failed. Anything else (collection error, 0) does not count.
        return result.returncode == 1 and " failed" in result.stdout, tail


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--broker", help="only this broker's mutants")
    parser.add_argument("--short", action="store_true", help="only the quick subset")
    parser.add_argument("--name", help="only the mutants whose name contains this text")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds per mutant")
    args = parser.parse_args(argv)
    chosen = [
        m
        for m in load()
        if (args.broker is None or m.broker == args.broker)
        and (m.short or not args.short)
        and (args.name is None or args.name in m.name)
    ]
    survivors = []
    for mutant in chosen:
        caught, tail = run(mutant, sys.executable, args.timeout)
        print(
            f"{'caught  ' if caught else 'SURVIVED'} [{mutant.broker}] {mutant.name}: {tail.splitlines()[-1]}"
        )
        if not caught:
            survivors.append(mutant.name)
            print(tail)
    if survivors:
        print(f"{len(survivors)} mutant(s) survived the contract suite: {', '.join(survivors)}")
        return 1
    print(f"all {len(chosen)} mutant(s) caught")
    return 0


if __name__ == "__main__":
    sys.exit(main())
