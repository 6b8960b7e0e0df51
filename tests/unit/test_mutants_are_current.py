"""
Every mutant of scripts/mutants.toml is a whole entry, still applies to the current code and names real tests.

CI runs only the short list of mutants (tests/integration/contract/test_mutants_short.py); the
long form is a script. A refactor that changes a mutated line leaves its mutant stale, and only
the next run of the long form found it (the credit-window mutant had gone stale this way). These
checks are pure text: they catch a stale mutant in the unit tests, without a broker.
"""

from __future__ import annotations

import ast
import functools
import importlib.util
import sys
from collections import Counter
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _load_mutants() -> ModuleType:
    spec = importlib.util.spec_from_file_location("shared_stream_mutants", ROOT / "scripts" / "mutants.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while building the class
    spec.loader.exec_module(module)
    return module


RUNNER = _load_mutants()
with RUNNER.DATA.open("rb") as data:
    ENTRIES = RUNNER.tomllib.load(data)["mutant"]


def _whole(entry):
    """The entry as the runner's ``Mutant``, or None: the test of its fields names what it lacks."""
    try:
        return RUNNER.mutant(entry)
    except ValueError:
        return None


MUTANTS = [mutant for mutant in map(_whole, ENTRIES) if mutant is not None]


@functools.cache
def _tree(path: Path) -> ast.Module:
    """A test module parsed once for all the mutants that name it (hundreds name the contract's)."""
    return ast.parse(path.read_text())


@functools.cache
def _test_names(path: Path) -> frozenset[str]:
    """Names of the test functions a module defines (its own and its classes')."""
    return frozenset(
        node.name
        for node in ast.walk(_tree(path))
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name.startswith("test_")
    )


@pytest.mark.parametrize("entry", ENTRIES, ids=lambda e: f"{e.get('broker')}: {e.get('name')}")
def test_each_entry_states_every_field_and_no_other(entry):
    # The runner refuses such an entry too, but only when it runs: this names it without a broker.
    fields = {"name", "broker", "guarantee", "file", "snippet", "replacement", "tests", "module", "short"}
    required = fields - {"module", "short"}
    assert required <= set(entry), f"fields missing: {sorted(required - set(entry))}"
    assert set(entry) <= fields, f"unknown fields: {sorted(set(entry) - fields)}"
    texts = ("name", "broker", "guarantee", "file", "snippet", "replacement", "module")
    assert all(isinstance(entry.get(key, ""), str) for key in texts)
    assert all(entry[key].strip() for key in ("name", "broker", "guarantee", "file", "snippet"))
    assert "\n" not in entry["guarantee"], "the guarantee a mutant breaks is one line"
    assert isinstance(entry.get("short", False), bool)
    assert isinstance(entry["tests"], list)
    assert entry["tests"], "it names no test that must catch it"
    assert all(isinstance(test, str) and test for test in entry["tests"])


def test_names_are_unique_within_a_broker():
    # ``--name`` and the parametrized ids here tell mutants apart by broker and name; one bug may
    # have a mutant in each broker under one name (``--name "no credit window"`` runs them all).
    repeated = [
        key for key, count in Counter((e.get("broker"), e.get("name")) for e in ENTRIES).items() if count > 1
    ]
    assert not repeated, f"mutants named twice: {repeated}"


def test_the_runner_loads_every_entry():
    assert RUNNER.load() == tuple(MUTANTS)
    assert len(MUTANTS) == len(ENTRIES)


@pytest.mark.parametrize("mutant", MUTANTS, ids=lambda m: f"{m.broker}: {m.name}")
def test_the_files_it_names_exist(mutant):
    assert (ROOT / mutant.file).is_file(), f"mutant {mutant.name!r} mutates no such file: {mutant.file}"
    if mutant.module:
        assert (ROOT / mutant.module).is_file(), f"mutant {mutant.name!r}: no such module {mutant.module}"
    paths = {test_id.split("::")[0] for test_id in mutant.test_ids()}
    missing = sorted(path for path in paths if not (ROOT / path).is_file())
    assert not missing, f"mutant {mutant.name!r} runs tests of no such file: {missing}"


@pytest.mark.parametrize("mutant", MUTANTS, ids=lambda m: f"{m.broker}: {m.name}")
def test_the_mutated_snippet_occurs_exactly_once(mutant):
    source = (ROOT / mutant.file).read_text()
    assert source.count(mutant.snippet) == 1, (
        f"mutant {mutant.name!r} no longer applies to {mutant.file}: update it to the current code"
    )
    assert mutant.replacement != mutant.snippet


@pytest.mark.parametrize("mutant", MUTANTS, ids=lambda m: f"{m.broker}: {m.name}")
def test_the_tests_that_must_catch_it_exist(mutant):
    # A contract test is defined in the shared contract modules or in the broker's own contract module;
    # a test of the module the mutant names, there; any other test is named by its node id
    # (a test class may inherit its tests from tests/integration/contract).
    if mutant.module:
        defined = set(_test_names(ROOT / mutant.module))
    else:
        contract = ROOT / "tests" / "integration" / mutant.broker / f"test_{mutant.broker}_contract.py"
        defined = set().union(*map(_test_names, (ROOT / "tests" / "integration" / "contract").glob("*.py")))
        if contract.exists():
            defined |= _test_names(contract)
    inherited = set().union(*map(_test_names, (ROOT / "tests" / "integration" / "contract").glob("*.py")))
    for test_id in mutant.tests:
        if "::" in test_id:
            path, *_, name = test_id.split("::")
            if name.split("[")[0] in _test_names(ROOT / path) | inherited:
                defined.add(test_id)
    missing = [name for name in mutant.tests if name not in defined]
    assert mutant.tests, f"mutant {mutant.name!r} names no test that must catch it"
    assert not missing, f"mutant {mutant.name!r} names no such test: {missing}"


@pytest.mark.parametrize("mutant", MUTANTS, ids=lambda m: f"{m.broker}: {m.name}")
def test_its_test_ids_name_the_brokers_contract_class(mutant):
    # An id naming a class the module does not define collects no test: the mutant "survives".
    for test_id in mutant.test_ids():
        if test_id.count("::") != 2:
            continue  # a module-level test: the test above checks its name
        path, cls, _ = test_id.split("::")
        classes = {node.name for node in ast.walk(_tree(ROOT / path)) if isinstance(node, ast.ClassDef)}
        assert cls in classes, f"mutant {mutant.name!r} runs {test_id}, but {path} defines no {cls}"


def test_the_short_list_is_the_two_the_suite_runs():
    # tests/integration/contract/test_mutants_short.py asserts "all 2 mutant(s) caught".
    assert sum(mutant.short for mutant in MUTANTS) == 2
