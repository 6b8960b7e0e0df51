#!/usr/bin/env python
"""
Port ``Mutant(...)`` entries from a ``scripts/mutants.py`` of the old shape to ``scripts/mutants.toml``.

Until issue 49 the mutants were a Python tuple; branches cut before that still add theirs there.
This prints, as TOML to append to ``scripts/mutants.toml``, every entry of the old file's
``MUTANTS`` whose broker and name the data file does not hold yet, with the comment lines that
precede it. An entry that the data file holds with other fields is named on stderr (port it by
hand: the branch changed an existing mutant). The new ``guarantee`` field is made from the name
of the first test that must catch the mutant: read it and say it better where it needs to.

Usage::

    git show <branch>:scripts/mutants.py > /tmp/old_mutants.py
    .venv/bin/python scripts/port_mutants.py /tmp/old_mutants.py >> scripts/mutants.toml
    .venv/bin/python -m pytest -p no:cacheprovider -n 0 tests/unit/test_mutants_are_current.py

``--all`` prints every entry, whatever the data file holds (how the data file was first made).
"""

from __future__ import annotations

import argparse
import ast
import importlib.util
import json
import sys
from collections.abc import Iterable
from pathlib import Path
from types import ModuleType
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from mutants import DATA, load  # the runner beside this script

OLD_TO_NEW = {"path": "file", "original": "snippet", "mutated": "replacement", "caught_by": "tests"}
"""The old ``Mutant`` fields under their names in the data file."""

ORDER = ("name", "broker", "guarantee", "file", "module", "tests", "short", "snippet", "replacement")


def _old_module(path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location("old_shared_stream_mutants", path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while building the class
    spec.loader.exec_module(module)
    return module


def _guarantee(tests: Iterable[str]) -> str:
    """The first test's name in words: tests here are named after the guarantee they hold."""
    first = next(iter(tests)).split("::")[-1].split("[")[0]
    return first.removeprefix("test_").replace("_", " ")


def entries(path: Path) -> list[tuple[list[str], dict[str, Any]]]:
    """Each old mutant as a data-file entry, with the comment lines written just above it."""
    source = path.read_text()
    lines = source.splitlines()
    module = _old_module(path)
    tuple_node = next(
        node.value
        for node in ast.parse(source).body
        if isinstance(node, ast.AnnAssign | ast.Assign)
        and isinstance(node.value, ast.Tuple)
        and "MUTANTS" in ast.unparse(node.targets[0] if isinstance(node, ast.Assign) else node.target)
    )
    found: list[tuple[list[str], dict[str, Any]]] = []
    previous_end = tuple_node.lineno
    for element in tuple_node.elts:
        assert element.end_lineno is not None
        between = lines[previous_end : element.lineno - 1]
        comments = [line.strip() for line in between if line.strip().startswith("#")]
        previous_end = element.end_lineno
        starred = isinstance(element, ast.Starred)
        expression = ast.Expression(body=element.value if isinstance(element, ast.Starred) else element)
        value = eval(compile(expression, str(path), "eval"), vars(module))
        for index, mutant in enumerate(value if starred else [value]):
            old = vars(mutant)
            entry = {OLD_TO_NEW.get(key, key): old[key] for key in old}
            entry["tests"] = list(entry["tests"])
            entry["guarantee"] = _guarantee(entry["tests"])
            found.append((comments if index == 0 else [], entry))
    return found


def _string(text: str) -> str:
    """A multi-line literal string (the snippet as it reads in the code) where TOML allows one."""
    plain = all(char in "\t\n" or (char >= " " and char != "\x7f") for char in text)
    trailing_space = any(line != line.rstrip() for line in text.split("\n"))
    if plain and "\n" in text and "'''" not in text and not text.endswith("'") and not trailing_space:
        return f"'''\n{text}'''"
    if plain and "\n" not in text and "'" not in text and '"' in text:
        return f"'{text}'"  # a part of one line with quotes in it: a literal string, no escapes
    return json.dumps(text, ensure_ascii=False)


def _tests(tests: list[str]) -> str:
    inline = "[" + ", ".join(json.dumps(test) for test in tests) + "]"
    if len(inline) <= 100:
        return inline
    return "[\n" + "".join(f"    {json.dumps(test)},\n" for test in tests) + "]"


def to_toml(comments: list[str], entry: dict[str, Any]) -> str:
    out = [*comments, "[[mutant]]"]
    for key in ORDER:
        value: Any = entry.get(key)
        if key in ("module", "short") and not value:
            continue  # defaults: the broker's contract suite, not in the short list
        if key == "tests":
            out.append(f"tests = {_tests(value)}")
        elif key == "short":
            out.append("short = true")
        elif key in ("snippet", "replacement"):
            out.append(f"{key} = {_string(value)}")
        else:
            out.append(f"{key} = {json.dumps(value, ensure_ascii=False)}")
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("old", type=Path, help="a scripts/mutants.py of the old shape")
    parser.add_argument("--all", action="store_true", help="every entry, whatever the data file holds")
    args = parser.parse_args(argv)
    held = {} if args.all else {(m.broker, m.name): vars(m) for m in load(DATA)}
    blocks = []
    for comments, entry in entries(args.old):
        known = held.get((entry["broker"], entry["name"]))
        if known is None:
            blocks.append(to_toml(comments, entry))
            continue
        fields = set(entry) - {"guarantee"}
        held_entry = {**known, "tests": list(known["tests"])}
        changed = sorted(key for key in fields if held_entry[key] != entry[key])
        if changed:
            print(f"changed, port by hand: [{entry['broker']}] {entry['name']}: {changed}", file=sys.stderr)
    print("".join(f"\n{block}" for block in blocks), end="")  # a blank line before each, as in the file
    return 0


if __name__ == "__main__":
    sys.exit(main())
